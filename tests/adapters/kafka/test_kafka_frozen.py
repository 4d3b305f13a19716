"""docs/failure-semantics.md#broker-outages on genuine Kafka, a *frozen* broker: SIGSTOPped, it
keeps its connections open and answers nothing. The outage watch's ApiVersions probe reports it
within 10 s (aiokafka alone notices after its 40 s request timeout): one WARNING naming it, and
``upstream_connected`` false; SIGCONT brings it back with one INFO.

The broker is the test's own (``LocalKafkaBroker``: it is frozen, so it cannot be the session's).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ackgate import Message, Service
from ackgate.testing._local import LocalKafkaBroker
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster


async def until(check: Callable[[], object], limit: float) -> None:
    """Poll ``check`` (statistics and log records offer nothing to await), bounded."""
    async with asyncio.timeout(limit):
        while True:
            if check():
                return
            await asyncio.sleep(0.05)


#: What the issue asks: a frozen broker shows within 10 s (it took 41 s).
SHOWN_WITHIN = 10.0


async def test_a_frozen_broker_is_reported_within_10_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = LocalKafkaBroker(tmp_path)
    await asyncio.to_thread(broker.start)  # it waits with a loop of its own
    process = broker.process
    assert process is not None
    try:
        kafka = KafkaTestCluster(broker.bootstrap)
        topic, group = kafka.unique("frozen"), kafka.unique("g")
        await kafka.create_topic(topic, 1)
        await kafka.produce(topic, 3, 1)
        seen: list[bytes] = []
        service = Service(
            "frozen",
            producer=lambda: KafkaStreamProducer(
                topic, bootstrap_servers=broker.bootstrap, group_id=group
            ),
        )

        @service.handler("only")
        async def only(message: Message) -> None:
            seen.append(message.body)

        caplog.set_level(logging.INFO, logger="ackgate.upstream")
        running = asyncio.create_task(service.run())
        try:
            await until(lambda: len(seen) >= 3, 30)
            os.kill(process.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                await until(
                    lambda: (g := service.stats().group) is not None and not g.upstream_connected,
                    SHOWN_WITHIN,
                )
                shown_after = time.monotonic() - frozen_at
                lost = [r.getMessage() for r in caplog.records if r.name == "ackgate.upstream"]
                assert len(lost) == 1 and lost[0].startswith("Upstream lost"), lost
                assert "did not answer an ApiVersions request" in lost[0]
                print(f"frozen broker reported after {shown_after:.1f}s")
            finally:
                os.kill(process.pid, signal.SIGCONT)
            await until(
                lambda: any(r.getMessage().startswith("Upstream back") for r in caplog.records),
                30,
            )
            messages = [r.getMessage() for r in caplog.records if r.name == "ackgate.upstream"]
            assert [m.split(" ", 2)[:2] for m in messages] == [
                ["Upstream", "lost"],
                ["Upstream", "back"],
            ]
        finally:
            await service.stop(5)
            await running
    finally:
        broker.stop()
