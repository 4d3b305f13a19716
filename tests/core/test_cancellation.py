"""Cancellation at the edges: cancelled pulls leave nothing behind, and a
``CancelledError`` the producer raises itself is a failure, never a silent stall."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from ackgate import AdvanceFailed, SharedStreamManager, StreamTerminated
from ackgate.testing import ScriptedProducer

from .conftest import turn


async def test_cancelled_pulls_on_an_idle_stream_do_not_pile_up(
    manager: SharedStreamManager,
) -> None:
    producer = ScriptedProducer()
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for _ in range(200):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(sub), 0)
        pull = asyncio.create_task(anext(sub))
        await turn()
        pull.cancel()
        await asyncio.gather(pull, return_exceptions=True)
        assert len(sub._group.waiters) == 0
        producer.feed("a", 0)
        assert await asyncio.wait_for(anext(sub), 5) == "a"  # pulls still work


async def test_open_stream_raising_cancelled_error_itself_ends_the_group(
    manager: SharedStreamManager, caplog: pytest.LogCaptureFixture
) -> None:
    producer = ScriptedProducer()
    stray = asyncio.CancelledError("not from ackgate")
    producer.fail(stray)
    with caplog.at_level(logging.ERROR, logger="ackgate"):
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            with pytest.raises(StreamTerminated) as info:
                await asyncio.wait_for(anext(sub), 5)
    assert type(info.value) is StreamTerminated
    assert info.value.__cause__ is stray
    assert producer.closed == 1
    assert any("CancelledError" in r.getMessage() for r in caplog.records)


async def test_fast_path_source_raising_cancelled_error_ends_the_group(
    manager: SharedStreamManager,
) -> None:
    async def source() -> AsyncIterator[str]:
        await asyncio.sleep(0)
        raise asyncio.CancelledError
        yield "never"

    async with manager.subscribe("k", "s", source=source) as sub:
        with pytest.raises(StreamTerminated) as info:
            await asyncio.wait_for(anext(sub), 5)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)


async def test_advance_raising_cancelled_error_itself_is_advance_failed(
    manager: SharedStreamManager, caplog: pytest.LogCaptureFixture
) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    producer.feed("b", 1)
    stray = asyncio.CancelledError("the SDK's own")
    producer.advance_error = stray
    with caplog.at_level(logging.ERROR, logger="ackgate"):
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            await anext(sub)
            await anext(sub)  # "a" resolves: its advance raises
            with pytest.raises(AdvanceFailed) as info:
                await asyncio.wait_for(anext(sub), 5)
    assert info.value.__cause__ is stray
    assert producer.batches == [] and producer.closed == 1
    assert any(r.levelno == logging.ERROR for r in caplog.records)


async def test_cancelling_the_manager_task_still_cancels_an_advance() -> None:
    """Our own cancellation (loop teardown) is told apart from a stray one."""
    producer = ScriptedProducer()
    producer.advance_gate = asyncio.Event()  # never set: the advance hangs
    producer.feed("a", 0)
    manager = SharedStreamManager()
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    await anext(sub)
    leaving = asyncio.create_task(sub.aclose())  # last one: the stop waits for the advance
    await turn()
    assert producer.in_flight == 1
    stop = sub._group.stop_task
    assert stop is not None and not stop.done()
    stop.cancel()
    await asyncio.gather(stop, leaving, return_exceptions=True)
    assert producer.in_flight == 0 and producer.closed == 1
    assert sub._group.terminal is not None and sub._group.terminal[0] is StreamTerminated
