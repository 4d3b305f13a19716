"""docs/production.md#service-options concurrency and ordering: at most N calls at once; "lane" one
at a time per lane in stream order, "key" one at a time per key, "none" up to the cap."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer


class Probe:
    """Counts calls in flight, in total and per ordering key, and the order calls began."""

    def __init__(self) -> None:
        self.total = 0
        self.max_total = 0
        self.per_key: Counter[Hashable] = Counter()
        self.max_per_key = 0
        self.started: dict[Hashable, list[int]] = defaultdict(list)

    async def call(self, key: Hashable, offset: int) -> None:
        self.total += 1
        self.per_key[key] += 1
        self.max_total = max(self.max_total, self.total)
        self.max_per_key = max(self.max_per_key, self.per_key[key])
        self.started[key].append(offset)
        try:
            for _ in range(3):  # stay in flight over a few loop turns
                await asyncio.sleep(0)
        finally:
            self.total -= 1
            self.per_key[key] -= 1


def _offset(message: Message) -> int:
    return int(message.id.rsplit("/", 1)[1])


async def test_lane_ordering_never_runs_two_messages_of_a_lane_at_once(running: Any) -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=24)
    for n in range(1200):
        broker.publish("orders", b"m%d" % n, key=f"customer-{n}")
    service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "svc"))
    probe = Probe()

    @service.handler("h", concurrency=16)  # ordering="lane" is the default
    async def handle(message: Message) -> None:
        await probe.call(message.lane, _offset(message))

    async with running(service):
        await broker.wait_drained("orders", "svc")
    assert probe.max_per_key == 1
    assert 1 < probe.max_total <= 16
    for lane, offsets in probe.started.items():
        assert offsets == sorted(offsets), f"lane {lane} out of stream order"
    assert sum(map(len, probe.started.values())) == 1200


async def test_key_ordering_runs_one_at_a_time_per_key(running: Any) -> None:
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=1)  # one lane: only keys can tell them apart
    for n in range(600):
        broker.publish("orders", b"m%d" % n, key=f"customer-{n % 12}")
    for n in range(30):
        broker.publish("orders", b"unkeyed %d" % n)
    service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "svc"))
    probe = Probe()
    unkeyed = Probe()

    @service.handler("h", concurrency=8, ordering="key")
    async def handle(message: Message) -> None:
        if message.key is None:
            await unkeyed.call("none", _offset(message))
        else:
            await probe.call(message.key, _offset(message))

    async with running(service):
        await broker.wait_drained("orders", "svc")
    assert probe.max_per_key == 1
    assert 1 < probe.max_total <= 8
    for key, offsets in probe.started.items():
        assert offsets == sorted(offsets), f"key {key!r} out of stream order"
    assert len(probe.started) == 12
    assert unkeyed.max_per_key > 1  # messages without a key are not ordered


async def test_none_ordering_reaches_the_concurrency_cap_and_never_passes_it(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    publish(64)  # 4 partitions: "lane" would allow 4 at once
    service = Service("orders", producer=memory_producer)
    in_flight = 0
    peak = 0
    full = asyncio.Event()

    @service.handler("h", concurrency=8, ordering="none")
    async def handle(message: Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 8:
            full.set()
        try:
            await full.wait()  # the first 7 wait until the cap is reached
        finally:
            in_flight -= 1

    async with running(service):
        await broker.wait_drained("orders", "svc")
    assert peak == 8
