"""The test doubles and the conformance kit on both advance paths: ``advance`` and
``advance_runs`` (what a bulk adapter such as Kafka's overrides)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from ackgate import AdvanceOutcome, AdvanceRun, SharedStreamManager
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import ScriptedProducer, ScriptedRunsProducer
from ackgate.testing.conformance import (
    LANES,
    AdvanceLog,
    BrokerHarness,
    check_failed_is_redelivered,
    check_reject_goes_to_dlq,
    run_check,
)

TOPIC, GROUP = "paths", "svc"


async def test_scripted_runs_producer_records_runs_and_the_same_batches() -> None:
    producer = ScriptedRunsProducer()
    for n in range(4):
        producer.feed(b"ok" if n != 2 else b"bad", n)
    async with SharedStreamManager() as manager:
        async with manager.subscribe("k", "h", producer=lambda: producer) as sub:
            seen = 0
            async for raw in sub:
                if raw == b"bad":
                    sub.reject("bad")
                seen += 1
                if seen == 4:
                    break
        await producer.wait_advanced(4)
    assert producer.runs, "the group did not advance by runs"
    assert all(isinstance(run, AdvanceRun) for call in producer.runs for run in call)
    expanded = [[item for run in call for item in run.items()] for call in producer.runs]
    assert producer.batches == expanded
    assert producer.advanced_payloads == [0, 1, 2, 3]
    outcomes = [item.outcome for batch in producer.batches for item in batch]
    assert [(o.acked, o.rejected) for o in outcomes] == [(1, 0), (1, 0), (0, 1), (1, 0)]


async def test_scripted_producer_is_still_advanced_item_by_item() -> None:
    producer = ScriptedProducer()
    producer.feed(b"a", 0)
    async with SharedStreamManager() as manager:
        async with manager.subscribe("k", "h", producer=lambda: producer) as sub:
            async for _ in sub:
                break
        await producer.wait_advanced(1)
    assert producer.runs == []
    assert producer.advanced_payloads == [0]


async def test_scripted_runs_producer_raises_the_advance_error() -> None:
    producer = ScriptedRunsProducer()
    producer.advance_error = RuntimeError("commit refused")
    with pytest.raises(RuntimeError, match="commit refused"):
        await producer.advance_runs([AdvanceRun([0], AdvanceOutcome(1, 0, 0))])
    assert (producer.runs, producer.batches) == ([], [])


class RunsMemoryProducer(MemoryStreamProducer):
    """The in-process broker's producer, advanced by runs."""

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        await self.advance([item for run in runs for item in run.items()])


class MemoryHarness(BrokerHarness):
    """One partition per lane on the in-process broker; ``runs`` picks the producer."""

    def __init__(self, runs: bool) -> None:
        self.runs = runs
        self.broker = MemoryBroker()
        self.broker.create_topic(TOPIC, partitions=len(LANES))
        keys = (f"k{n}" for n in itertools.count())
        self.keys = {}
        for lane, partition in zip(LANES, range(len(LANES)), strict=True):
            self.keys[lane] = next(
                key for key in keys if self.broker.partition_for(TOPIC, key) == partition
            )

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        for lane, body in messages:
            self.broker.publish(TOPIC, body, key=self.keys[lane])

    def producer(self) -> MemoryStreamProducer:
        kind = RunsMemoryProducer if self.runs else MemoryStreamProducer
        return kind(self.broker, TOPIC, GROUP)

    def body(self, raw: Any) -> str:
        return str(raw)

    async def wait_fully_advanced(self) -> None:
        await self.broker.wait_drained(TOPIC, GROUP)

    async def unadvanced(self) -> int:
        ends = self.broker.end_offsets(TOPIC)
        committed = self.broker.committed(TOPIC, GROUP)
        return sum(ends[p] - committed[p] for p in ends)

    async def dead_lettered(self, count: int) -> list[str]:
        return [str(record.value) for record in self.broker.records(TOPIC + ".dlq")]


@pytest.mark.parametrize(("runs", "path"), [(True, "advance_runs"), (False, "advance")])
@pytest.mark.parametrize("check", [check_reject_goes_to_dlq, check_failed_is_redelivered])
async def test_the_kit_checks_an_adapter_on_its_own_advance_path(
    runs: bool, path: str, check: Any
) -> None:
    harness = MemoryHarness(runs)
    await run_check(check, harness)
    assert harness.advanced_by == path


def test_an_advance_through_the_other_path_fails_the_check() -> None:
    log = AdvanceLog()
    log.path = "advance_runs"
    log.calls["advance"] += 1
    with pytest.raises(AssertionError, match="advanced through advance_runs"):
        log.check_path()
