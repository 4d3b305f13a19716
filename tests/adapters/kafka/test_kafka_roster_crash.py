"""Issue 12 on genuine Kafka: a rostered three-handler service, a crashing handler, SIGKILL.

The consumer is ``roster_consumer.py`` (a subprocess). The invariant checked after the
kill, all along the restarted run and at the end: **the committed offset of every
partition never passes a valid message the indexer has not stored**. Committed offsets
are read before the index, and the index only grows, so a pass is never spurious.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

from .crash_scenario import CrashScenario, deliveries, indexed, read_dlq
from .kafka_testlib import KafkaTestCluster

PARTITIONS = 2
COUNT = 5_000
SCENARIO = CrashScenario(COUNT, PARTITIONS, "roster_consumer.py")


async def test_committed_never_passes_what_the_indexer_did_not_store(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group, dlq = kafka.unique("roster-crash"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.create_topic(dlq, 1)
    await SCENARIO.produce(kafka, topic)
    started = time.monotonic()

    first = SCENARIO.start_consumer(kafka, topic, group, dlq, tmp_path)
    try:
        async with asyncio.timeout(90):
            # Another process writes the index: nothing to await, so poll it.
            # A first commit at offset 0 (the deliveries recorded before any advance)
            # is not yet something to check: wait for one past it.
            while len(indexed(tmp_path)) < COUNT // 3 or not any(
                (await kafka.committed(group)).values()
            ):
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
    assert SCENARIO.unstored_below_commit(at_kill, topic, tmp_path) == []

    checks, _ = await SCENARIO.run_to_the_end(kafka, topic, group, dlq, tmp_path)
    seconds = time.monotonic() - started

    assert indexed(tmp_path) == set(SCENARIO.valid_at())
    malformed = SCENARIO.malformed
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
