"""Start a genuine Apache Kafka broker (KRaft, single node) as a local Java process.

Used by ``tests/adapters/kafka/conftest.py`` (the session fixture) and by
``benchmarks/kafka_e2e.py``. The official ``org.apache.kafka:kafka_2.13`` jars and their
runtime dependencies are fetched with Maven (``pom.xml`` beside this file) into
``$XDG_CACHE_HOME/ackgate/kafka-<version>/libs`` (``~/.cache`` by default) once and
reused. Every failure raises :class:`BrokerError` carrying the broker's log tail.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType

from aiokafka.admin import AIOKafkaAdminClient

from ackgate_test_support.local_server import free_port

POM = Path(__file__).resolve().parent / "pom.xml"
START_TIMEOUT = 120.0
# Small heap and C1 only: the tests are short and the machine is shared.
TEST_JAVA_OPTS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def _die_with_parent() -> None:
    """In the forked child: on Linux, get SIGTERM when the process that started us dies.

    So a test run that is killed outright does not leave a broker behind.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


class BrokerError(RuntimeError):
    """The broker jars could not be fetched or the broker did not start."""


def kafka_version() -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise BrokerError(f"{POM} defines no <kafka.version>")
    return match.group(1)


def broker_libs() -> Path:
    """Return the cached jar directory, fetching it with Maven the first time."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "ackgate" / f"kafka-{kafka_version()}"
    libs = home / "libs"
    if (home / "complete").exists():
        return libs
    if shutil.which("mvn") is None:
        raise BrokerError("fetching the Kafka broker jars needs Maven (mvn) on PATH")
    partial = home / "libs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    command = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise BrokerError(f"mvn could not fetch the Kafka broker jars:\n{output}")
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    (home / "complete").touch()
    return libs


async def metadata_ok(bootstrap: str) -> bool:
    """True if a broker at ``bootstrap`` answers a metadata request."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except Exception:
        return False
    finally:
        await admin.close()


class LocalKafkaBroker:
    """One KRaft broker+controller on free 127.0.0.1 ports, storage under ``workdir``.

    ``with LocalKafkaBroker(workdir) as broker:`` starts it and waits until it answers a
    metadata request; leaving the block stops it (SIGTERM, then SIGKILL after 30 s).
    """

    def __init__(self, workdir: Path, java_opts: tuple[str, ...] = TEST_JAVA_OPTS) -> None:
        self.workdir = workdir
        self.java_opts = java_opts
        self.port, self.controller_port = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = workdir / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalKafkaBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no broker log: {exc})"

    def start(self) -> None:
        classpath = f"{broker_libs()}/*"
        config = self._write_config()
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        with self.log.open("ab") as out:
            formatted = subprocess.run(
                [
                    "java",
                    *self.java_opts,
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
            )
        if formatted.returncode != 0:
            raise BrokerError(f"Kafka storage format failed:\n{self.log_tail()}")
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                ["java", *self.java_opts, "-cp", classpath, "kafka.Kafka", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(
                    f"Kafka broker exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if asyncio.run(metadata_ok(self.bootstrap)):
                return
            time.sleep(0.25)
        raise BrokerError(f"Kafka broker not ready after {START_TIMEOUT}s:\n{self.log_tail()}")

    def _write_config(self) -> Path:
        config = self.workdir / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # Tests rebalance often: no initial delay, short sessions allowed.
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
        }
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return config
