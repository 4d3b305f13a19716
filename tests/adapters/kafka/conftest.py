"""A genuine Apache Kafka broker (KRaft, single node) for the Kafka adapter tests.

The session fixture ``kafka_bootstrap`` uses ``ACKGATE_KAFKA_BOOTSTRAP`` when set.
Otherwise it fetches the official ``org.apache.kafka:kafka_2.13`` jars and their runtime
dependencies with Maven (``pom.xml`` beside this file) into
``$XDG_CACHE_HOME/ackgate/kafka-<version>/libs`` (``~/.cache`` by default; reused once
complete), formats KRaft storage in a temporary directory, starts ``kafka.Kafka`` on
free 127.0.0.1 ports and waits until a metadata request succeeds. If anything fails the
tests fail with the broker's log tail; they are never skipped.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from kafka_testlib import KafkaTestCluster, free_port

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
START_TIMEOUT = 120.0
JAVA_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def _kafka_version() -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    assert match, "pom.xml must define <kafka.version>"
    return match.group(1)


def _libs_dir() -> Path:
    """Return the cached jar directory, fetching it with Maven the first time."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "ackgate" / f"kafka-{_kafka_version()}"
    libs = home / "libs"
    if (home / "complete").exists():
        return libs
    if shutil.which("mvn") is None:
        pytest.fail("Kafka tests need Maven (mvn) on PATH to fetch the broker jars")
    partial = home / "libs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    result = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        pytest.fail(
            "mvn could not fetch the Kafka broker jars:\n" + (result.stdout + result.stderr)[-4000:]
        )
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    (home / "complete").touch()
    return libs


def _log_tail(log: Path, lines: int = 60) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no broker log: {exc})"


async def _metadata_ok(bootstrap: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except Exception:
        return False
    finally:
        await admin.close()


class _Broker:
    def __init__(self, workdir: Path, libs: Path) -> None:
        self.port, controller = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = workdir / "broker.log"
        config = workdir / "server.properties"
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{controller}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{controller}",
                    f"advertised.listeners=PLAINTEXT://{self.bootstrap}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={workdir / 'data'}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "group.min.session.timeout.ms=1000",
                    "auto.create.topics.enable=true",
                    "log.flush.interval.messages=100000",
                ]
            )
            + "\n"
        )
        classpath = f"{libs}/*"
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        with self.log.open("ab") as out:
            formatted = subprocess.run(
                [
                    "java",
                    *JAVA_OPTS,
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
            pytest.fail(f"Kafka storage format failed:\n{_log_tail(self.log)}")
        self._out = self.log.open("ab")
        self.process = subprocess.Popen(
            ["java", *JAVA_OPTS, "-cp", classpath, "kafka.Kafka", str(config)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                pytest.fail(
                    f"Kafka broker exited with {self.process.returncode}:\n{_log_tail(self.log)}"
                )
            if asyncio.run(_metadata_ok(self.bootstrap)):
                return
            time.sleep(0.25)
        self.stop()
        pytest.fail(f"Kafka broker not ready after {START_TIMEOUT}s:\n{_log_tail(self.log)}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._out.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a running Kafka broker for the whole session."""
    external = os.environ.get("ACKGATE_KAFKA_BOOTSTRAP")
    if external:
        if not asyncio.run(_metadata_ok(external)):
            pytest.fail(f"ACKGATE_KAFKA_BOOTSTRAP={external!r} does not answer metadata requests")
        yield external
        return
    started = time.monotonic()
    libs = _libs_dir()
    fetched = time.monotonic()
    broker = _Broker(tmp_path_factory.mktemp("kafka"), libs)
    try:
        broker.wait_ready()
        print(
            f"\nKafka broker {_kafka_version()} ready at {broker.bootstrap}: jars "
            f"{fetched - started:.1f}s, start {time.monotonic() - fetched:.1f}s"
        )
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaTestCluster:
    return KafkaTestCluster(kafka_bootstrap)
