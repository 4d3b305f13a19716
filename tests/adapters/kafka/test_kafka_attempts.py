"""docs/failure-semantics.md#poison-messages on genuine Kafka: ``Message.attempt`` and the offset
map in commit metadata.

* attempts count up across redeliveries within one life;
* what a life finished past a held offset is not delivered again by the next one;
* garbage in the metadata is ignored: everything from the committed offset is
  delivered again, nothing lost;
* a service that SIGKILLs itself on one message counts its attempts up across restarts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from ackgate import Message, Redelivery, Service
from ackgate_kafka import KafkaStreamProducer
from ackgate_kafka._offset_map import OffsetRuns, decode, encode

from .kafka_testlib import KafkaTestCluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


class Flaky(Exception):
    """A handler failing a call on purpose."""


def service_on(kafka: KafkaTestCluster, topic: str, group: str) -> Service:
    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)

    return Service("attempts", producer=make)


async def committed_map(kafka: KafkaTestCluster, group: str, tp: TopicPartition) -> object:
    found = await kafka.committed_metadata(group, tp)
    if found is None:
        return None
    return found[0], decode(found[1], tp.topic, tp.partition, found[0])


async def run_until_committed(
    service: Service, kafka: KafkaTestCluster, group: str, topic: str, partitions: int = 1
) -> None:
    running = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(60):
            await kafka.wait_committed_to_end(group, topic, partitions)
    finally:
        await service.stop()
        await running


async def test_attempts_count_up_across_redeliveries_within_a_life(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("attempts"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 6, 1)
    service = service_on(kafka, topic, group)
    seen: dict[str, list[tuple[int, int | None]]] = defaultdict(list)

    @service.handler("flaky")
    async def flaky(message: Message) -> None:
        seen["flaky"].append((message.raw.offset, message.attempt))
        if message.raw.offset == 2 and message.attempt is not None and message.attempt < 3:
            raise Flaky(message.id)

    @service.handler("steady")
    async def steady(message: Message) -> None:
        seen["steady"].append((message.raw.offset, message.attempt))

    await run_until_committed(service, kafka, group, topic)
    assert [a for o, a in seen["flaky"] if o == 2] == [1, 2, 3]
    assert all(a == 1 for o, a in seen["flaky"] if o != 2)
    # The steady handler acked 2 the first time: never handed it again
    # (docs/concepts.md#redelivery-memory).
    assert seen["steady"] == [(o, 1) for o in range(6)]


async def test_what_a_life_finished_past_a_hold_is_not_delivered_again(
    kafka: KafkaTestCluster,
) -> None:
    count = 40
    topic, group = kafka.unique("offset-map"), kafka.unique("g")
    tp = TopicPartition(topic, 0)
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, count, 1)

    # Life 1: "b" fails offset 2 every time; everything after it is handled.
    first = service_on(kafka, topic, group)
    handled: dict[str, set[int]] = defaultdict(set)
    failed_at: list[int | None] = []

    @first.handler("a")
    async def a1(message: Message) -> None:
        handled["a"].add(message.raw.offset)

    # A backoff past half the ack timeout: each failure goes to the broker (a hold),
    # which is what records the offsets finished past it in the commit metadata.
    @first.handler("b", redelivery=Redelivery(backoff=1e3, max_backoff=1e3))
    async def b1(message: Message) -> None:
        if message.raw.offset == 2:
            failed_at.append(message.attempt)
            raise Flaky(message.id)
        handled["b"].add(message.raw.offset)

    running = asyncio.create_task(first.run())
    try:
        async with asyncio.timeout(60):
            # The broker offers nothing to await: poll the committed map until the
            # offsets after the held one are all in it.
            while True:
                found = await committed_map(kafka, group, tp)
                if found is not None and not isinstance(found[1], str):
                    offset, offset_map = found
                    if offset == 2 and list(offset_map.finished.runs()) == [(3, count)]:
                        break
                await asyncio.sleep(0.1)
    finally:
        await first.stop()
        await running
    assert handled["b"] == set(range(count)) - {2}

    # Life 2: both handlers ack; only the held offset comes back, counted, and only to
    # the handler that had not finished it.
    second = service_on(kafka, topic, group)
    again: dict[str, list[tuple[int, int | None]]] = defaultdict(list)

    @second.handler("a")
    async def a2(message: Message) -> None:
        again["a"].append((message.raw.offset, message.attempt))

    @second.handler("b")
    async def b2(message: Message) -> None:
        again["b"].append((message.raw.offset, message.attempt))

    await run_until_committed(second, kafka, group, topic)
    # "a" acked it in life 1 (the map records each member's acks): only "b" gets it.
    assert again["a"] == []
    assert [o for o, _ in again["b"]] == [2]
    # Its attempts go on from the deliveries life 1 recorded in the commit metadata.
    assert failed_at == list(range(1, len(failed_at) + 1))
    assert isinstance(again["b"][0][1], int) and again["b"][0][1] > len(failed_at)


async def test_garbage_metadata_is_ignored_and_everything_is_delivered_again(
    kafka: KafkaTestCluster,
) -> None:
    count = 10
    topic, group = kafka.unique("garbage"), kafka.unique("g")
    await kafka.create_topic(topic, 2)
    await kafka.produce(topic, count, 2)  # offsets 0..4 in each partition
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    raw = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group)
    raw.assign([tp0, tp1])
    await raw.start()
    try:
        # Partition 0: garbage behind our prefix. Partition 1: a well-formed map that
        # names 2..4 finished, but written for a commit at offset 0, not 1.
        foreign, _ = encode(topic, 1, 0, OffsetRuns(iter([(2, 5)])), 5, {})
        await raw.commit({tp0: (1, "ackgate1:" + "Zm9vYmFy" * 20), tp1: (1, foreign)})
    finally:
        await raw.stop()

    service = service_on(kafka, topic, group)
    seen: dict[int, list[int]] = defaultdict(list)

    @service.handler("only")
    async def only(message: Message) -> None:
        seen[message.raw.partition].append(message.raw.offset)

    await run_until_committed(service, kafka, group, topic, 2)
    assert seen == {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}


async def test_a_crash_loop_counts_attempts_up_across_restarts(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group, dlq = kafka.unique("crashloop"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, 1)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, 5, 1)  # bodies b"0".."4": offset n holds b"n"
    command = [sys.executable, str(HERE / "crashloop_consumer.py"), kafka.bootstrap]
    command += [topic, group, dlq, str(tmp_path), "2"]
    for _ in range(3):
        assert run_to_death(command, tmp_path) == -9, "it should die on message 2; see err"
    calls = [line.split() for line in (tmp_path / "worker.log").read_text().splitlines()]
    assert [int(a) for o, a in calls if o == "2"] == [1, 2, 3]


async def test_a_crash_loop_with_give_up_after_dead_letters_the_message_and_moves_on(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    """The worker dies on message 2 before it can fail it, so no failure ever turns into
    a reject: on the delivery past ``give_up_after`` (attempt 4 of 3) the worker is not
    called again and gives the message up, unresolved."""
    topic, group, dlq = kafka.unique("giveup"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, 1)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, 5, 1)
    command = [sys.executable, str(HERE / "crashloop_consumer.py"), kafka.bootstrap]
    command += [topic, group, dlq, str(tmp_path), "2", "3"]
    for _ in range(3):
        assert run_to_death(command, tmp_path) == -9, "it should die on message 2; see err"
    last = start(command, tmp_path)
    try:
        async with asyncio.timeout(90):
            await kafka.wait_committed_to_end(group, topic, 1)
        (record,) = await kafka.read_all(dlq, 1)
    finally:
        last.send_signal(signal.SIGTERM)
        assert last.wait(timeout=30) == 0
    assert record.value == b"2"
    reason = dict(record.headers)["ackgate.reason"].decode()
    assert reason.startswith("rejected by 1 of 2 subscribers: worker: gave up after 3 attempts")
    worker = [line.split() for line in (tmp_path / "worker.log").read_text().splitlines()]
    auditor = [line.split() for line in (tmp_path / "auditor.log").read_text().splitlines()]
    assert [int(a) for o, a in worker if o == "2"] == [1, 2, 3]  # never called a 4th time
    assert [int(a) for o, a in auditor if o == "2"][-1] == 4  # the auditor handled it
    assert {o for o, _ in worker} == {o for o, _ in auditor} == {"0", "1", "2", "3", "4"}


def test_give_up_after_without_a_dlq_topic_is_refused_at_start() -> None:
    service = Service(
        "refused",
        producer=lambda: KafkaStreamProducer("t", bootstrap_servers="127.0.0.1:1", group_id="g"),
    )

    @service.handler("worker", give_up_after=3)
    async def worker(message: Message) -> None:
        pass

    with pytest.raises(ValueError, match=r"'worker' sets give_up_after=3.*dlq_topic"):
        asyncio.run(service.run())
    with_dlq = KafkaStreamProducer(
        "t", bootstrap_servers="127.0.0.1:1", group_id="g", dlq_topic="t.dlq"
    )
    assert with_dlq.dead_letter_destination() == "Kafka topic t.dlq"


def start(command: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(command, env=env, stderr=(workdir / "err").open("ab"))


def run_to_death(command: list[str], workdir: Path) -> int:
    """Run the consumer until it exits (it kills itself); its return code."""
    process = start(command, workdir)
    try:
        return process.wait(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
