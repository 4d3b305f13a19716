"""A three-broker Kafka cluster (KRaft, each node broker and controller), one per namespace.

Genuine Apache Kafka from the Maven jars the tests use (``ackgate.testing``'s
``kafka-pom.xml``), Java 17, each JVM with ``-Xmx512m`` and few threads: three of them
share two cores with six consumer processes. Topics are replicated three times with
``min.insync.replicas=2``, the internal offsets topic too, so one broker down loses
nothing and blocks nothing.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
import uuid
from pathlib import Path

from network import Network

from ackgate.testing._local import _die_with_parent, kafka_libs, kafka_metadata_ok, log_tail

JAVA_OPTS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
BROKERS = ("k1", "k2", "k3")
PORT, CONTROLLER_PORT = 9092, 9093


class ClusterError(RuntimeError):
    """A broker did not start in time or exited; the message ends with its log tail."""


class Cluster:
    def __init__(self, network: Network, workdir: Path) -> None:
        self.network = network
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.cluster_id = ""
        while not self.cluster_id or self.cluster_id.startswith("-"):  # not an option
            self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.network.address(b)}:{PORT}" for b in BROKERS)

    def node_id(self, broker: str) -> int:
        return BROKERS.index(broker) + 1

    def broker_of(self, node_id: int) -> str:
        return BROKERS[node_id - 1]

    def _config(self, broker: str) -> Path:
        address = self.network.address(broker)
        voters = ",".join(
            f"{self.node_id(b)}@{self.network.address(b)}:{CONTROLLER_PORT}" for b in BROKERS
        )
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id(broker)),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{address}:{PORT},CONTROLLER://{address}:{CONTROLLER_PORT}",
            "advertised.listeners": f"PLAINTEXT://{address}:{PORT}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / broker / "data"),
            "default.replication.factor": "3",
            "min.insync.replicas": "2",
            "offsets.topic.replication.factor": "3",
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": "3",
            "transaction.state.log.min.isr": "2",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # Small: three brokers share two cores.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.replica.fetchers": "1",
            "background.threads": "2",
            "log.cleaner.enable": "false",
        }
        path = self.workdir / broker / "server.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _log(self, broker: str) -> Path:
        return self.workdir / broker / "broker.log"

    async def start_all(self, within: float) -> None:
        classpath = f"{kafka_libs()}/*"
        for broker in BROKERS:
            config = self._config(broker)
            storage = ["kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c"]
            with self._log(broker).open("ab") as out:
                done = await asyncio.to_thread(
                    subprocess.run,
                    ["java", *JAVA_OPTS, "-cp", classpath, *storage, str(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=120,
                    check=False,
                )
            if done.returncode != 0:
                raise ClusterError(
                    f"{broker}: storage format failed:\n{log_tail(self._log(broker))}"
                )
        for broker in BROKERS:  # together: the quorum needs two of three to elect
            self.start(broker)
        for broker in BROKERS:
            await self.ready(broker, within)

    def start(self, broker: str) -> None:
        """Start the broker (on its storage, formatted by :meth:`start_all`)."""
        classpath = f"{kafka_libs()}/*"
        config = self.workdir / broker / "server.properties"
        argv = ["java", *JAVA_OPTS, "-cp", classpath, "kafka.Kafka", str(config)]
        with self._log(broker).open("ab") as out:
            self.processes[broker] = subprocess.Popen(
                self.network.exec_argv(broker, argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # SIGTERM if the driver is SIGKILLed
            )

    async def ready(self, broker: str, within: float) -> None:
        """Wait until the broker answers a metadata request."""
        address = f"{self.network.address(broker)}:{PORT}"
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.processes[broker].poll() is not None:
                raise ClusterError(f"{broker} exited:\n{log_tail(self._log(broker))}")
            if await kafka_metadata_ok(address):
                return
            await asyncio.sleep(0.5)
        raise ClusterError(f"{broker} not ready in {within:.0f}s:\n{log_tail(self._log(broker))}")

    def kill(self, broker: str) -> None:
        """SIGKILL the broker: a crash. Its storage stays for :meth:`start`."""
        process = self.processes.pop(broker)
        process.kill()
        process.wait(timeout=30)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.processes.clear()
