"""docs/concepts.md#deferred-resolution: run_subscriber."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ackgate import (
    AckTimeout,
    AdvanceOutcome,
    SharedStreamManager,
    StreamTerminated,
    Subscription,
    reject_shared_stream_event,
)
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import outcomes


async def test_runner_binds_stores_and_confirms_each_output(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    stored: list[str] = []
    for i in range(4):
        producer.feed(i, i)

    async def handle(events: Subscription) -> AsyncIterator[str]:
        async for raw in events:
            if raw == 1:
                reject_shared_stream_event()
                continue
            yield f"derived-{raw}"
            yield f"again-{raw}"
            if raw == 3:
                return

    async def sink(output: str) -> None:
        await asyncio.sleep(0)
        stored.append(output)

    await manager.run_subscriber("k", "indexer", handle, producer=lambda: producer, sink=sink)
    assert stored == ["derived-0", "again-0", "derived-2", "again-2", "derived-3", "again-3"]
    assert outcomes(producer) == {
        0: AdvanceOutcome(1, 0, 0),
        1: AdvanceOutcome(0, 0, 1),
        2: AdvanceOutcome(1, 0, 0),
        3: AdvanceOutcome(1, 0, 0),
    }


async def test_runner_reraises_the_handlers_exception_and_fails_the_event(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    producer.feed(0, 0)

    async def handle(events: Subscription) -> AsyncIterator[str]:
        async for raw in events:
            yield f"out-{raw}"
            raise LookupError("bad record")

    with pytest.raises(LookupError):
        await manager.run_subscriber("k", "s", handle, producer=lambda: producer)
    assert outcomes(producer) == {0: AdvanceOutcome(0, 1, 0)}


async def test_runner_sink_failure_fails_the_event(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    producer.feed(0, 0)

    async def handle(events: Subscription) -> AsyncIterator[int]:
        async for raw in events:
            yield raw

    async def sink(output: int) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await manager.run_subscriber("k", "s", handle, producer=lambda: producer, sink=sink)
    assert outcomes(producer) == {0: AdvanceOutcome(0, 1, 0)}


async def test_runner_reraises_stream_terminated(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    boom = ConnectionResetError()
    producer.fail(boom)

    async def handle(events: Subscription) -> AsyncIterator[None]:
        async for _ in events:
            yield None

    with pytest.raises(StreamTerminated) as info:
        await manager.run_subscriber("k", "s", handle, producer=lambda: producer)
    assert info.value.__cause__ is boom


async def test_runner_reraises_ack_timeout() -> None:
    clock = FakeClock()
    producer = ScriptedProducer()
    producer.feed(0, 0)
    producer.feed(1, 1)
    async with SharedStreamManager(clock=clock, ack_timeout=1.0) as manager:

        async def handle(events: Subscription) -> AsyncIterator[None]:
            async for _ in events:
                clock.advance(2.0)  # this event took too long
                if False:
                    yield None

        with pytest.raises(AckTimeout):
            await manager.run_subscriber("k", "s", handle, producer=lambda: producer)


async def test_runner_is_cancellation_safe(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    producer.feed(0, 0)
    in_sink = asyncio.Event()

    async def handle(events: Subscription) -> AsyncIterator[int]:
        async for raw in events:
            yield raw

    async def sink(output: int) -> None:
        in_sink.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(
        manager.run_subscriber("k", "s", handle, producer=lambda: producer, sink=sink)
    )
    await in_sink.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcomes(producer) == {0: AdvanceOutcome(0, 1, 0)}
    assert producer.closed == 1
    assert manager.stats() == []


async def test_runner_accepts_a_coroutine_function_with_no_outputs(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    producer.feed(0, 0)
    seen: list[int] = []

    async def handle(events: Subscription) -> None:
        async for raw in events:
            seen.append(raw)
            return

    await manager.run_subscriber("k", "s", handle, producer=lambda: producer)
    assert seen == [0]
    assert outcomes(producer) == {0: AdvanceOutcome(1, 0, 0)}


async def test_runner_refuses_a_handler_that_is_not_async(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    def handle(events: Subscription) -> list[int]:
        return [1, 2]

    with pytest.raises(TypeError, match="async generator"):
        await manager.run_subscriber("k", "s", handle, producer=lambda: producer)  # type: ignore[arg-type]
    assert manager.stats() == []
