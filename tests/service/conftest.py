"""Shared fixtures of the Service tests (docs/production.md#service-options): fixtures, not imports,
so the test modules need no package and work under ``--import-mode=importlib``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ackgate import Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

Running = Callable[..., contextlib.AbstractAsyncContextManager["asyncio.Task[None]"]]


@pytest.fixture
def broker() -> MemoryBroker:
    """An ``orders`` topic of 4 partitions; publish bytes into it."""
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=4)
    return broker


@pytest.fixture
def memory_producer(broker: MemoryBroker) -> Callable[[], MemoryStreamProducer]:
    """The factory a service gives its group: ``orders`` as consumer group ``svc``."""
    return lambda: MemoryStreamProducer(broker, "orders", "svc")


@pytest.fixture
def running() -> Running:
    """``async with running(service) as task:`` runs it, then stops it and awaits ``run()``.

    Everything inside is bounded by ``limit`` seconds, so a broken test fails
    instead of hanging.
    """

    @contextlib.asynccontextmanager
    async def run(
        service: Service, *, stop_timeout: float = 5.0, limit: float = 30.0
    ) -> AsyncIterator[asyncio.Task[None]]:
        async with asyncio.timeout(limit):
            task = asyncio.create_task(service.run())
            try:
                yield task
            finally:
                await service.stop(stop_timeout)
                await task

    return run


@pytest.fixture
def publish(broker: MemoryBroker) -> Callable[..., list[Any]]:
    """``publish(n, key=...)``: ``b"m<i>"`` bodies into ``orders``; their positions."""

    def publish(count: int, key: Callable[[int], str | None] = lambda i: None) -> list[Any]:
        return [broker.publish("orders", b"m%d" % i, key=key(i)) for i in range(count)]

    return publish
