"""The public conformance kit over MemoryStreamProducer and the in-process broker."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing.conformance import LANES, BrokerHarness, ConformanceSuite

TOPIC, GROUP = "conformance", "svc"


class MemoryHarness(BrokerHarness):
    """One partition per lane; the DLQ is the ``<topic>.dlq`` topic."""

    def __init__(self) -> None:
        self.broker = MemoryBroker()
        self.broker.create_topic(TOPIC, partitions=len(LANES))
        # A record key per lane that lands in the lane's own partition.
        self.keys: dict[str, str] = {}
        for lane, partition in zip(LANES, range(len(LANES)), strict=True):
            self.keys[lane] = next(
                key
                for key in (f"{lane}-{n}" for n in itertools.count())
                if self.broker.partition_for(TOPIC, key) == partition
            )

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        for lane, body in messages:
            self.broker.publish(TOPIC, body, key=self.keys[lane])

    def producer(self) -> MemoryStreamProducer:
        return MemoryStreamProducer(self.broker, TOPIC, GROUP)

    def body(self, raw: Any) -> str:
        return str(raw)

    async def wait_fully_advanced(self) -> None:
        await self.broker.wait_drained(TOPIC, GROUP)

    async def unadvanced(self) -> int:
        ends = self.broker.end_offsets(TOPIC)
        committed = self.broker.committed(TOPIC, GROUP)
        return sum(ends[p] - committed[p] for p in ends)

    async def dead_lettered(self, count: int) -> list[str]:
        dead = [str(record.value) for record in self.broker.records(TOPIC + ".dlq")]
        assert len(dead) == count, dead
        return dead


class TestMemoryConformance(ConformanceSuite):
    @pytest.fixture
    def harness(self) -> MemoryHarness:
        return MemoryHarness()
