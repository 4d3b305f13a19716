"""A consumer host: ``ackgate run hostservice:service --workers 2`` in its namespace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from network import Network

from ackgate.testing._local import _die_with_parent, http_status

HERE = Path(__file__).resolve().parent
HEALTH_PORT = 8080
SHUTDOWN_TIMEOUT = 10.0
ACKGATE = str(Path(sys.executable).with_name("ackgate"))


class HostError(RuntimeError):
    """A host did not become ready in time, or did not stop."""


class Host:
    def __init__(self, network: Network, name: str, env: dict[str, str], log: Path) -> None:
        self.network = network
        self.name = name
        self.env = {**os.environ, **env, "MH_HOST": name, "PYTHONPATH": str(HERE)}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def readyz(self) -> str:
        return f"http://{self.network.address(self.name)}:{HEALTH_PORT}/readyz"

    def start(self) -> None:
        argv = [ACKGATE, "run", "hostservice:service", "--workers", "2"]
        argv += ["--health-port", str(HEALTH_PORT), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
        argv += ["--log-level", "WARNING"]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.network.exec_argv(self.name, argv),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # SIGTERM if the driver is SIGKILLed
            )

    async def ready(self, within: float) -> float:
        """Wait until ``/readyz`` answers 200 (both workers in the group, the broker
        reachable); the seconds it took."""
        started = time.monotonic()
        deadline = started + within
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise HostError(f"{self.name} is not running; see {self.log}")
            if await asyncio.to_thread(http_status, self.readyz) == 200:
                return time.monotonic() - started
            await asyncio.sleep(0.25)
        raise HostError(f"{self.name} not ready after {within:.0f}s; see {self.log}")

    def kill(self) -> int:
        """SIGKILL every process of the host at once; how many there were."""
        killed = self.network.kill_all(self.name)
        if self.process is not None:
            self.process.wait(timeout=30)
            self.process = None
        return killed

    async def terminate(self) -> int:
        """SIGTERM, as an orchestrator stops a host; its exit status once it is gone."""
        if self.process is None:
            raise HostError(f"{self.name} is not running")
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(process.wait, SHUTDOWN_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            self.network.kill_all(self.name)
            process.wait(timeout=30)
            raise HostError(f"{self.name} did not stop within its shutdown timeout") from None
