"""The SIGKILL scenarios' shared half: messages, the consumer subprocess, the checks.

A scenario publishes ``count`` messages over ``partitions`` (about 2 % malformed:
``bad-<n>``), runs a consumer script as a subprocess that stores valid messages in
``<workdir>/index.db`` and logs each handler's deliveries to ``<workdir>/<id>.log``,
and reads back what the broker and the index hold.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from .kafka_testlib import KafkaTestCluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def value(n: int) -> bytes:
    """About 2 % malformed: the auditor rejects them, the indexer skips them."""
    return f"bad-{n}".encode() if n % 50 == 13 else str(n).encode()


@dataclass(frozen=True)
class CrashScenario:
    count: int
    partitions: int
    consumer_script: str

    @property
    def malformed(self) -> set[int]:
        return {n for n in range(self.count) if n % 50 == 13}

    def position(self, n: int) -> tuple[int, int]:
        """Message ``n`` goes to partition ``n % partitions``."""
        return n % self.partitions, n // self.partitions

    def valid_at(self) -> dict[tuple[int, int], int]:
        """``(partition, offset) -> n`` of every valid message."""
        return {self.position(n): n for n in range(self.count) if n % 50 != 13}

    async def produce(self, kafka: KafkaTestCluster, topic: str) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, value(n), partition=n % self.partitions)
                for n in range(self.count)
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    def start_consumer(
        self, kafka: KafkaTestCluster, topic: str, group: str, dlq: str, workdir: Path
    ) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        return subprocess.Popen(
            [
                sys.executable,
                str(HERE / self.consumer_script),
                *(kafka.bootstrap, topic, group, dlq, str(workdir)),
            ],
            env=env,
            stderr=(workdir / "consumer.err").open("ab"),
        )

    async def run_to_the_end(
        self, kafka: KafkaTestCluster, topic: str, group: str, dlq: str, workdir: Path
    ) -> tuple[int, dict[TopicPartition, int]]:
        """Start a consumer, check the invariant all along until everything is committed,
        stop it with SIGTERM (it must exit 0). Returns the checks made and the end offsets."""
        checks = 0
        process = self.start_consumer(kafka, topic, group, dlq, workdir)
        try:
            ends = await kafka.end_offsets(topic, self.partitions)
            async with asyncio.timeout(180):
                while True:
                    assert process.poll() is None, "consumer exited early; see consumer.err"
                    committed = await kafka.committed(group)
                    assert self.unstored_below_commit(committed, topic, workdir) == []
                    checks += 1
                    if all(committed.get(tp) == end for tp, end in ends.items()):
                        break
                    await asyncio.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        return checks, ends

    def unstored_below_commit(
        self, committed: dict[TopicPartition, int], topic: str, workdir: Path
    ) -> list[tuple[int, int]]:
        """Valid messages below the committed offset that the index lacks (must be none).
        Committed offsets are read first and the index only grows: a failure is real."""
        stored = indexed(workdir)
        return sorted(
            (p, o)
            for (p, o) in self.valid_at()
            if o < committed.get(TopicPartition(topic, p), 0) and (p, o) not in stored
        )


def indexed(workdir: Path) -> set[tuple[int, int]]:
    path = workdir / "index.db"
    if not path.exists():
        return set()
    # The consumer writes while we read: wait for its lock rather than fail the read.
    db = sqlite3.connect(path, timeout=60)
    try:
        return {(p, o) for p, o in db.execute("SELECT partition, offset FROM events")}
    except sqlite3.OperationalError as exc:
        # Only a missing table means "nothing stored yet". Any other error (a lock held
        # too long) must not read as an empty index: the invariant check would then
        # report every committed message as unstored.
        if "no such table" in str(exc):
            return set()
        raise
    finally:
        db.close()


def deliveries(workdir: Path, sid: str) -> Counter[tuple[int, int]]:
    seen: Counter[tuple[int, int]] = Counter()
    path = workdir / f"{sid}.log"
    if path.exists():
        for line in path.read_text().splitlines():
            p, o = line.split()
            seen[int(p), int(o)] += 1
    return seen


async def read_dlq(kafka: KafkaTestCluster, dlq: str, malformed: set[int]) -> list[Any]:
    """Read the DLQ from the start until every malformed message is there (30 s at most)."""
    consumer = AIOKafkaConsumer(
        dlq, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(30):
            while {int(r.value.removeprefix(b"bad-")) for r in records} < malformed:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
        return records
    finally:
        await consumer.stop()
