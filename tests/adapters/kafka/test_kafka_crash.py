"""A consumer process SIGKILLed mid-stream, then restarted: nothing lost, few duplicates."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from aiokafka.structs import TopicPartition

from .kafka_testlib import KafkaTestCluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SUBSCRIBERS = 2


def start_consumer(
    kafka: KafkaTestCluster, topic: str, group: str, sinks: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "crash_consumer.py"),
            kafka.bootstrap,
            topic,
            group,
            str(sinks),
            str(SUBSCRIBERS),
        ],
        env=env,
        stderr=(sinks / "consumer.err").open("ab"),
    )


def read_sink(path: Path) -> Counter[tuple[int, int]]:
    seen: Counter[tuple[int, int]] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            partition, offset = line.split()
            seen[int(partition), int(offset)] += 1
    return seen


async def wait_for_lines(path: Path, lines: int, process: subprocess.Popen[bytes]) -> None:
    """Poll the sink file (another process writes it; nothing to await) until it has ``lines``."""
    while sum(read_sink(path).values()) < lines:
        assert process.poll() is None, "consumer exited early; see consumer.err"
        await asyncio.sleep(0.02)


async def test_sigkill_mid_stream_then_restart_loses_nothing(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group = kafka.unique("crash"), kafka.unique("g")
    partitions, count = 2, 6_000
    await kafka.create_topic(topic, partitions)
    await kafka.produce(topic, count, partitions)
    sinks = [tmp_path / f"sub-{i}.log" for i in range(SUBSCRIBERS)]

    first = start_consumer(kafka, topic, group, tmp_path)
    try:
        async with asyncio.timeout(60):
            await wait_for_lines(sinks[0], count // 4, first)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    committed_at_kill = await kafka.committed(group)
    assert sum(committed_at_kill.values()) < count, "the consumer finished before the kill"

    second = start_consumer(kafka, topic, group, tmp_path)
    try:
        async with asyncio.timeout(120):
            await kafka.wait_committed_to_end(group, topic, partitions)
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()

    expected = {(n % partitions, n // partitions) for n in range(count)}
    for sink in sinks:
        seen = read_sink(sink)
        assert set(seen) == expected, f"{sink.name}: missing {sorted(expected - set(seen))[:10]}"
        for (partition, offset), times in seen.items():
            committed = committed_at_kill.get(TopicPartition(topic, partition), 0)
            if times > 1:
                assert offset >= committed, (
                    f"{sink.name}: {partition}@{offset} seen {times}x below commit {committed}"
                )
