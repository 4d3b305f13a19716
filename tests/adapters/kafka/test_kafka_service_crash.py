"""Issue 13 on genuine Kafka: an ``ackgate.Service`` with three handlers, a flaky handler
with retries, and the consumer process SIGKILLed twice.

The consumer is ``service_consumer.py`` (a subprocess). 10,000 messages over 4
partitions, 2 % malformed (the auditor rejects them), and the notifier fails 2 % of
messages deterministically 1 to 4 times (``Retry(attempts=3)``: some succeed on a
retry, some exhaust it and are handed to the notifier again in-process). The process is
killed once a quarter and again once two thirds of the valid messages are indexed, and
started again each time. All along, the committed offset of every partition must never pass a valid
message the indexer has not stored; at the end every valid message is stored, every
malformed one is in the DLQ with the auditor's reason, and committed = end offsets.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

from .crash_scenario import CrashScenario, deliveries, indexed, read_dlq
from .kafka_testlib import KafkaTestCluster

PARTITIONS = 4
COUNT = 10_000
SCENARIO = CrashScenario(COUNT, PARTITIONS, "service_consumer.py")
KILL_AT = (0.25, 0.65)  # fractions of the valid messages indexed


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)


async def test_service_survives_two_kills_with_retries_and_rejects(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group, dlq = kafka.unique("svc-crash"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.create_topic(dlq, 1)
    await SCENARIO.produce(kafka, topic)
    valid = SCENARIO.valid_at()
    started = time.monotonic()
    checks = 0
    kills: list[tuple[int, int]] = []  # (indexed, committed) at each kill

    for fraction in KILL_AT:
        process = SCENARIO.start_consumer(kafka, topic, group, dlq, tmp_path)
        try:
            async with asyncio.timeout(120):
                # Another process writes the index: nothing to await, so poll it.
                while True:
                    assert process.poll() is None, "consumer exited early; see consumer.err"
                    committed = await kafka.committed(group)
                    assert SCENARIO.unstored_below_commit(committed, topic, tmp_path) == []
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
        assert SCENARIO.unstored_below_commit(at_kill, topic, tmp_path) == []
        kills.append((len(indexed(tmp_path)), sum(at_kill.values())))

    more_checks, ends = await SCENARIO.run_to_the_end(kafka, topic, group, dlq, tmp_path)
    checks += more_checks
    seconds = time.monotonic() - started

    assert await kafka.committed(group) == ends
    assert indexed(tmp_path) == set(valid)
    malformed = SCENARIO.malformed
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
