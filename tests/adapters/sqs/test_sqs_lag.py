"""docs/production.md#lag-and-the-oldest-message on a real SQS server: the queue's approximate
counts (visible: waiting, not visible: in flight), read every few seconds, in
``GroupStats.broker_lag``: three messages in flight while a handler holds them, none once
released and deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import ackgate_sqs._lag
from ackgate import Message, Service
from ackgate_sqs import SqsStreamProducer

from .sqs_support import REGION, SqsAdmin


async def until(check: Callable[[], Any], what: str, limit: float = 20.0) -> Any:
    """Poll ``check`` (statistics offer nothing to await), bounded."""
    async with asyncio.timeout(limit):
        while True:
            if found := check():
                return found
            await asyncio.sleep(0.05)


async def test_the_queue_counts_show_what_is_waiting_and_in_flight(
    sqs: SqsAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ackgate_sqs._lag, "COUNTS_INTERVAL", 0.2)
    url = await sqs.create_queue()
    await sqs.send(url, ["a", "b", "c"])
    service = Service(
        "queued",
        producer=lambda: SqsStreamProducer(
            url, region_name=REGION, endpoint_url=sqs.endpoint, wait_time_seconds=1
        ),
    )
    release = asyncio.Event()

    @service.handler("slow", concurrency=3)
    async def slow(message: Message) -> None:
        await release.wait()

    running = asyncio.create_task(service.run())
    try:

        def counts() -> tuple[int | None, int | None] | None:
            group = service.stats().group
            lag = None if group is None else group.broker_lag
            return None if lag is None else (lag.waiting, lag.in_flight)

        await until(lambda: counts() == (0, 3), "3 messages in flight")
        release.set()
        await until(lambda: counts() == (0, 0), "none left once deleted")
    finally:
        release.set()
        await service.stop(5)
        await running
