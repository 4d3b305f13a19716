"""The memory broker as a service's test double, through SharedStreamManager."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from ackgate import SharedStreamManager, Subscription
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer, Position
from ackgate_test_support.reject_reasons import REASONS, reject_with_reasons


def orders(count: int, partitions: int = 3) -> tuple[MemoryBroker, dict[int, Position]]:
    broker = MemoryBroker()
    broker.create_topic("orders", partitions)
    positions = {n: broker.publish("orders", n, key=f"customer-{n % 7}") for n in range(count)}
    return broker, positions


def producer_of(
    broker: MemoryBroker, made: list[MemoryStreamProducer]
) -> Callable[[], MemoryStreamProducer]:
    def make() -> MemoryStreamProducer:
        made.append(MemoryStreamProducer(broker, "orders", "svc"))
        return made[-1]

    return make


async def test_crash_reject_and_store_all_balance() -> None:
    broker, positions = orders(90)
    made: list[MemoryStreamProducer] = []
    stored: list[int] = []
    crashed = False

    async def store(events: AsyncIterator[int]) -> AsyncIterator[int]:
        async for n in events:
            yield n

    async def save(n: int) -> None:
        stored.append(n)

    async def audit(sub: Subscription) -> None:
        nonlocal crashed
        async with sub:
            async for n in sub:
                if n == 40 and not crashed:
                    crashed = True
                    raise RuntimeError("auditor crashed")
                if n % 10 == 3:
                    sub.reject()

    async with SharedStreamManager() as manager:
        make = producer_of(broker, made)
        storer = asyncio.create_task(
            manager.run_subscriber("orders", "store", store, producer=make, sink=save)
        )
        with pytest.raises(RuntimeError, match="auditor crashed"):
            await audit(manager.subscribe("orders", "audit", producer=make))
        auditor = asyncio.create_task(audit(manager.subscribe("orders", "audit", producer=make)))
        async with asyncio.timeout(10):
            await broker.wait_drained("orders", "svc")
        storer.cancel()
        auditor.cancel()
        await asyncio.gather(storer, auditor, return_exceptions=True)

    assert broker.committed("orders", "svc") == broker.end_offsets("orders")
    assert set(stored) == set(range(90))
    dead = broker.records("orders.dlq")
    assert sorted(record.origin for record in dead if record.origin) == sorted(
        positions[n] for n in range(90) if n % 10 == 3
    )
    assert all(record.reason == "rejected by 1 of 2 subscribers" for record in dead)
    [producer] = made
    assert producer.stats.held >= 1 and producer.stats.redelivered >= 1


async def test_a_restarted_service_gets_what_was_not_committed() -> None:
    broker, _ = orders(30)
    made: list[MemoryStreamProducer] = []
    first_run: list[int] = []
    async with (
        SharedStreamManager() as manager,
        manager.subscribe("orders", "svc", producer=producer_of(broker, made)) as sub,
    ):
        async for n in sub:
            first_run.append(n)
            if len(first_run) == 10:
                break  # leaves cleanly on its 10th event: 10 acked, the rest never handed
    committed = sum(broker.committed("orders", "svc").values())
    assert committed == 10

    second_run: list[int] = []
    async with SharedStreamManager() as manager:
        sub = manager.subscribe("orders", "svc", producer=producer_of(broker, made))
        async with sub, asyncio.timeout(10):
            for _ in range(20):
                second_run.append(await anext(sub))
    assert broker.committed("orders", "svc") == broker.end_offsets("orders")
    assert set(first_run).isdisjoint(second_run)
    assert set(first_run) | set(second_run) == set(range(30))
    assert made[1].stats.redelivered >= 1  # events queued for the first run came again


async def test_dlq_record_reason_names_the_rejecting_subscribers_in_subscription_order() -> None:
    broker, positions = orders(1, partitions=1)
    raw = await reject_with_reasons("orders", lambda: MemoryStreamProducer(broker, "orders", "svc"))
    assert raw == 0
    [dead] = broker.records("orders.dlq")
    assert dead.reason == (
        "rejected by 2 of 3 subscribers; auditor: schema v3 unsupported; parser: bad json"
    )
    assert "; ".join(REASONS) in dead.reason
    assert (dead.origin, dead.key, dead.value) == (positions[0], b"customer-0", 0)
    assert broker.committed("orders", "svc") == broker.end_offsets("orders")
