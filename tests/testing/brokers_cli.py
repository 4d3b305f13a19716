"""Running ``python -m ackgate.testing.brokers up`` as a subprocess (imported relatively)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ackgate.testing.brokers import GIVEN


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the variables that name a given broker: a child started
    with it finds its brokers the way a fresh session would."""
    env = {name: value for name, value in os.environ.items() if name not in GIVEN.values()}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def start_up(kind: str, *flags: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start ``up kind``; return the process and the variables it printed."""
    # A CI script run in the background inherits an ignored SIGINT (POSIX shells ignore
    # it for asynchronous jobs), and a child would keep it ignored. Handled here while
    # the child starts, it is reset to the default in the child by exec: Ctrl-C works
    # there as for a terminal user. (Not ``preexec_fn``: forking with gRPC's threads
    # running, from the Pub/Sub tests, aborts the child.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "ackgate.testing.brokers", "up", kind, *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert process.stdout is not None
    exported: dict[str, str] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            _, err = process.communicate(timeout=30)
            raise AssertionError(f"up {kind} exited with {process.returncode}:\n{err}")
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").strip().partition("=")
            exported[name] = value
        if line.startswith("#"):
            return process, exported
    process.kill()
    raise AssertionError(f"up {kind} printed no address in time")


def owned_containers(pid: int) -> list[str]:
    """Names of the ackgate containers the process ``pid`` started (any state)."""
    from ackgate.testing import _containers

    client = _containers.docker_client()
    try:
        prefix = f"{_containers.socket.gethostname()}:{pid}:"
        return [
            container.name
            for container in client.containers.list(
                all=True, filters={"label": f"{_containers.LABEL}=1"}
            )
            if container.labels.get(_containers.OWNER_LABEL, "").startswith(prefix)
        ]
    finally:
        client.close()
