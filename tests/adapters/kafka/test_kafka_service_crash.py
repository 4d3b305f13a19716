"""Issue 13 on genuine Kafka: an ``ackgate.Service`` with three handlers, a flaky handler
with retries, and the consumer process SIGKILLed twice.

The consumer is ``service_consumer.py`` (a subprocess). 10,000 messages over 4
partitions, 2 % malformed (the auditor rejects them), and the notifier fails 2 % of
messages deterministically 1 to 4 times (``Retry(attempts=3)``: some succeed on a
retry, some exhaust it and are redelivered by Kafka). The process is killed once a
quarter and again once two thirds of the valid messages are indexed, and started again
each time. All along, the committed offset of every partition must never pass a valid
message the indexer has not stored; at the end every valid message is stored, every
malformed one is in the DLQ with the auditor's reason, and committed = end offsets.
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
PARTITIONS = 4
COUNT = 10_000
KILL_AT = (0.25, 0.65)  # fractions of the valid messages indexed


def value(n: int) -> bytes:
    return f"bad-{n}".encode() if n % 50 == 13 else str(n).encode()


def valid_at() -> dict[tuple[int, int], int]:
    """``(partition, offset) -> n`` of every valid message (n goes to partition n % 4)."""
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
            str(HERE / "service_consumer.py"),
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
    """Valid messages below the committed offset that the index lacks (must be none).
    Committed offsets are read first and the index only grows: a failure is real."""
    stored = indexed(workdir)
    return sorted(
        (p, o)
        for (p, o) in valid_at()
        if o < committed.get(TopicPartition(topic, p), 0) and (p, o) not in stored
    )


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


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)


async def test_service_survives_two_kills_with_retries_and_rejects(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group, dlq = kafka.unique("svc-crash"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.create_topic(dlq, 1)
    await produce(kafka, topic)
    valid = valid_at()
    started = time.monotonic()
    checks = 0
    kills: list[tuple[int, int]] = []  # (indexed, committed) at each kill

    for fraction in KILL_AT:
        process = start_consumer(kafka, topic, group, dlq, tmp_path)
        try:
            async with asyncio.timeout(120):
                # Another process writes the index: nothing to await, so poll it.
                while True:
                    assert process.poll() is None, "consumer exited early; see consumer.err"
                    committed = await kafka.committed(group)
                    assert unstored_below_commit(committed, topic, tmp_path) == []
                    checks += 1
                    stored = len(indexed(tmp_path))
                    if stored >= fraction * len(valid) and committed:
                        break
                    await asyncio.sleep(0.02)
            kill(process)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        at_kill = await kafka.committed(group)
        assert unstored_below_commit(at_kill, topic, tmp_path) == []
        kills.append((len(indexed(tmp_path)), sum(at_kill.values())))

    last = start_consumer(kafka, topic, group, dlq, tmp_path)
    try:
        ends = await kafka.end_offsets(topic, PARTITIONS)
        async with asyncio.timeout(180):
            while True:
                assert last.poll() is None, "consumer exited early; see consumer.err"
                committed = await kafka.committed(group)
                assert unstored_below_commit(committed, topic, tmp_path) == []
                checks += 1
                if all(committed.get(tp) == end for tp, end in ends.items()):
                    break
                await asyncio.sleep(0.2)
        last.send_signal(signal.SIGTERM)
        assert last.wait(timeout=30) == 0
    finally:
        if last.poll() is None:
            last.kill()
            last.wait()
    seconds = time.monotonic() - started

    assert await kafka.committed(group) == ends
    assert indexed(tmp_path) == set(valid)
    malformed = {n for n in range(COUNT) if n % 50 == 13}
    dead = await read_dlq(kafka, dlq, malformed)
    assert {int(r.value.removeprefix(b"bad-")) for r in dead} == malformed
    for record in dead:
        reason = dict(record.headers)["ackgate.reason"]
        assert b"auditor: malformed: not an integer" in reason, reason
    # Every handler acked every message it had to (the auditor: the valid ones).
    assert set(deliveries(tmp_path, "indexer")) == set(valid) | {
        (n % PARTITIONS, n // PARTITIONS) for n in malformed
    }
    assert set(deliveries(tmp_path, "auditor")) == set(valid)
    assert set(deliveries(tmp_path, "notifier")) >= set(valid)
    stats = json.loads((tmp_path / "stats.json").read_text())
    duplicates = {
        sid: sum(c - 1 for c in deliveries(tmp_path, sid).values())
        for sid in ("indexer", "auditor", "notifier")
    }
    print(
        f"\n{COUNT} messages ({len(malformed)} malformed, "
        f"{sum(1 for n in range(COUNT) if n % 50 == 7)} flaky in the notifier), "
        f"kills at (indexed, committed) {kills} of {len(valid)} valid, "
        f"{checks} invariant checks, duplicates per handler {duplicates}, "
        f"DLQ records {len(dead)}, last process stats {stats}, {seconds:.1f}s"
    )
