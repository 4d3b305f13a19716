from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ackgate import AdvanceOutcome, SharedStreamManager
from ackgate.testing import FakeClock, ScriptedProducer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def producer() -> ScriptedProducer:
    return ScriptedProducer(lane=lambda payload: payload[0] if isinstance(payload, tuple) else None)


@pytest.fixture
async def manager(clock: FakeClock) -> AsyncIterator[SharedStreamManager]:
    async with asyncio.timeout(30):
        async with SharedStreamManager(clock=clock, ack_timeout=60.0) as m:
            yield m


async def turn(times: int = 20) -> None:
    """Let every ready task run a few steps (a loop turn, not a wall-clock wait)."""
    for _ in range(times):
        await asyncio.sleep(0)


def outcomes(producer: ScriptedProducer) -> dict[Any, AdvanceOutcome]:
    """Every advanced event's outcome, by broker payload."""
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


def fed(count: int) -> ScriptedProducer:
    """A producer fed ``count`` events: raw ``"e<n>"``, payload ``n``, one lane."""
    producer = ScriptedProducer()
    for n in range(count):
        producer.feed(f"e{n}", n)
    return producer
