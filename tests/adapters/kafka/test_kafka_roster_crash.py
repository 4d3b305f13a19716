"""Issue 12 on genuine Kafka: a rostered three-handler service, a crashing handler, SIGKILL.

The consumer is ``roster_consumer.py`` (a subprocess). The invariant checked after the
kill, all along the restarted run and at the end: **the committed offset of every
partition never passes a valid message the indexer has not stored**. Committed offsets
are read before the index, and the index only grows, so a pass is never spurious.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from .kafka_testlib import KafkaTestCluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PARTITIONS = 2
COUNT = 5_000


def value(n: int) -> bytes:
    """About 2 % malformed: the auditor rejects them, the indexer skips them."""
    return f"bad-{n}".encode() if n % 50 == 13 else str(n).encode()


def valid_at() -> dict[tuple[int, int], int]:
    """``(partition, offset) -> n`` of every valid message (n goes to partition n % 2)."""
    return {(n % PARTITIONS, n // PARTITIONS): n for n in range(COUNT) if n % 50 != 13}


async def produce(kafka: KafkaTestCluster, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value(n), partition=n % PARTITIONS) for n in range(COUNT)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def start_consumer(
    kafka: KafkaTestCluster, topic: str, group: str, dlq: str, workdir: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "roster_consumer.py"),
            *(kafka.bootstrap, topic, group, dlq, str(workdir)),
        ],
        env=env,
        stderr=(workdir / "consumer.err").open("ab"),
    )


def indexed(workdir: Path) -> set[tuple[int, int]]:
    path = workdir / "index.db"
    if not path.exists():
        return set()
    db = sqlite3.connect(path)
    try:
        return {(p, o) for p, o in db.execute("SELECT partition, offset FROM events")}
    except sqlite3.OperationalError:  # the table is not created yet
        return set()
    finally:
        db.close()


def unstored_below_commit(
    committed: dict[TopicPartition, int], topic: str, workdir: Path
) -> list[tuple[int, int]]:
    """Valid messages below the committed offset that the index lacks (must be none)."""
    stored = indexed(workdir)
    return sorted(
        (p, o)
        for (p, o) in valid_at()
        if o < committed.get(TopicPartition(topic, p), 0) and (p, o) not in stored
    )


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


def deliveries(workdir: Path, sid: str) -> Counter[tuple[int, int]]:
    seen: Counter[tuple[int, int]] = Counter()
    path = workdir / f"{sid}.log"
    if path.exists():
        for line in path.read_text().splitlines():
            p, o = line.split()
            seen[int(p), int(o)] += 1
    return seen


async def test_committed_never_passes_what_the_indexer_did_not_store(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group, dlq = kafka.unique("roster-crash"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.create_topic(dlq, 1)
    await produce(kafka, topic)
    started = time.monotonic()

    first = start_consumer(kafka, topic, group, dlq, tmp_path)
    try:
        async with asyncio.timeout(90):
            # Another process writes the index: nothing to await, so poll it.
            while len(indexed(tmp_path)) < COUNT // 3 or not await kafka.committed(group):
                assert first.poll() is None, "consumer exited early; see consumer.err"
                await asyncio.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    at_kill = await kafka.committed(group)
    assert 0 < sum(at_kill.values()) < COUNT, f"nothing to check at the kill: {at_kill}"
    assert unstored_below_commit(at_kill, topic, tmp_path) == []

    checks = 0
    second = start_consumer(kafka, topic, group, dlq, tmp_path)
    try:
        ends = await kafka.end_offsets(topic, PARTITIONS)
        async with asyncio.timeout(180):
            while True:
                assert second.poll() is None, "consumer exited early; see consumer.err"
                committed = await kafka.committed(group)
                assert unstored_below_commit(committed, topic, tmp_path) == []
                checks += 1
                if all(committed.get(tp) == end for tp, end in ends.items()):
                    break
                await asyncio.sleep(0.2)
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    seconds = time.monotonic() - started

    assert indexed(tmp_path) == set(valid_at())
    malformed = {n for n in range(COUNT) if n % 50 == 13}
    dead = await read_dlq(kafka, dlq, malformed)
    assert {int(record.value.removeprefix(b"bad-")) for record in dead} == malformed
    assert all(
        dict(record.headers)["ackgate.reason"].startswith(b"rejected by 1 of 3") for record in dead
    )
    stats = json.loads((tmp_path / "stats.json").read_text())
    redelivered = {
        sid: sum(c - 1 for c in deliveries(tmp_path, sid).values())
        for sid in ("indexer", "auditor", "notifier")
    }
    print(
        f"\n{COUNT} messages ({len(malformed)} malformed), committed at kill "
        f"{sum(at_kill.values())}, {checks} invariant checks, commits after restart "
        f"{stats[0]['advance_calls'] if stats else 0}, redeliveries {redelivered}, "
        f"skipped after restart {stats[0]['redeliveries_skipped'] if stats else 0}, "
        f"DLQ records {len(dead)}, {seconds:.1f}s"
    )
