"""docs/failure-semantics.md#broker-outages permanent errors: an exception of the producer factory
itself is raised by ``run()`` instead of being retried; ``restart_limit`` bounds restarts in a row
that advanced nothing; errors of an open stream are still restarted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from ackgate import AdvanceItem, Message, Service, StreamTerminated
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer


class Unreachable(MemoryStreamProducer):
    """Opens nothing: every stream fails at once, as a broker that is down."""

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        raise ConnectionError("broker unreachable")
        yield  # an async generator, as the contract asks


def a_service(factory: Callable[[], Any], **options: Any) -> tuple[Service, list[bytes]]:
    service = Service("orders", producer=factory, restart_backoff=0.0, **options)
    handled: list[bytes] = []

    @service.handler("h")
    async def handle(message: Message) -> None:
        handled.append(message.body)

    return service, handled


async def test_an_exception_of_the_producer_factory_is_raised_by_run_not_retried() -> None:
    calls = 0
    error = KeyError("ORDERS_BOOTSTRAP")

    def make() -> MemoryStreamProducer:
        nonlocal calls
        calls += 1
        raise error

    service, _ = a_service(make)
    with pytest.raises(KeyError) as raised:
        async with asyncio.timeout(10):
            await service.run()
    assert raised.value is error
    assert "producer factory of service 'orders'" in raised.value.__notes__[0]
    assert calls == 1
    stats = service.stats()
    assert stats.state == "stopped" and stats.restarts == 0


async def test_a_factory_returning_no_producer_is_a_permanent_error_too(
    broker: MemoryBroker,
) -> None:
    service, _ = a_service(lambda: broker)
    with pytest.raises(TypeError, match="must return a SharedStreamProducer, got MemoryBroker"):
        async with asyncio.timeout(10):
            await service.run()
    assert service.stats().restarts == 0


async def test_restart_limit_raises_the_last_cause_after_that_many_restarts_with_no_advance(
    broker: MemoryBroker,
) -> None:
    made = 0

    def make() -> Unreachable:
        nonlocal made
        made += 1
        return Unreachable(broker, "orders", "svc")

    service, _ = a_service(make, restart_limit=2)
    with pytest.raises(StreamTerminated) as raised:
        async with asyncio.timeout(10):
            await service.run()
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert "service 'orders' reached restart_limit=2" in raised.value.__notes__[0]
    assert made == 3 and service.stats().restarts == 2


async def test_restart_limit_zero_never_restarts(broker: MemoryBroker) -> None:
    service, _ = a_service(lambda: Unreachable(broker, "orders", "svc"), restart_limit=0)
    with pytest.raises(StreamTerminated):
        async with asyncio.timeout(10):
            await service.run()
    assert service.stats().restarts == 0


class EverySecondAdvanceFails(MemoryStreamProducer):
    """Each producer's first advance commits; its second raises (the group ends)."""

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2:
            raise ConnectionError("commit failed")
        await super().advance(batch)


async def test_a_group_life_that_advanced_resets_the_restart_count(
    broker: MemoryBroker, publish: Callable[..., list[Any]], running: Any
) -> None:
    """Every life advances before it fails, so ``restart_limit=1`` never gives up."""
    publish(60)
    service, handled = a_service(
        lambda: EverySecondAdvanceFails(broker, "orders", "svc"), restart_limit=1
    )
    async with running(service) as task:
        await broker.wait_drained("orders", "svc")
        assert not task.done()
    assert service.stats().restarts >= 2
    assert set(handled) == {b"m%d" % n for n in range(60)}


@pytest.mark.parametrize("limit", [-1, True, 1.5, "3"])
def test_restart_limit_is_none_or_an_integer_at_least_zero(limit: object) -> None:
    with pytest.raises(ValueError, match=r"restart_limit must be an int >= 0"):
        Service("orders", producer=lambda: None, restart_limit=limit)  # type: ignore[arg-type]
