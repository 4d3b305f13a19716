"""The conformance kit: one suite that every ackgate adapter passes against its real broker.

An adapter author implements :class:`BrokerHarness` (publish, a producer factory, and
three ways to look at the broker) and subclasses :class:`ConformanceSuite` with a
``harness`` fixture; pytest then runs one test per check::

    from ackgate.testing.conformance import BrokerHarness, ConformanceSuite

    class TestMyAdapter(ConformanceSuite):
        @pytest.fixture
        def harness(self, ackgate_kafka):
            return MyHarness(ackgate_kafka.bootstrap)

(see ``docs/writing-an-adapter.md``). Each check publishes a few tens of messages
over :data:`LANES`, subscribes three subscribers to one ackgate group in one step (so
all three are in every snapshot), lets them run until the broker is fully advanced,
stops them and then asserts what the subscribers saw, what ackgate handed to
``advance`` (recorded by :class:`RecordingProducer`, a transparent wrapper around the
adapter's producer that reads it as a group would: through ``open_stream_batches``
when the adapter yields batches) and what the broker holds:

* :func:`check_nothing_lost`: every subscriber sees every message; the broker ends
  with nothing unadvanced.
* :func:`check_order_per_lane`: within a lane every subscriber sees, and ackgate
  advances, messages in publish order; the adapter's lane keeps the lanes apart.
* :func:`check_reject_goes_to_dlq`: a rejected message lands in the adapter's DLQ,
  is advanced once and is not delivered again.
* :func:`check_failed_is_redelivered`: a message whose handler crashed is delivered
  again, then advanced clean.
* :func:`check_order_after_redelivery`: after that redelivery a lane is still
  advanced clean in publish order (needs :attr:`BrokerHarness.keeps_lane_order_on_redelivery`).
* :func:`check_cancel_and_restart`: the subscribers are cancelled mid-stream and a new
  group starts on the same source: nothing is lost, and nothing is advanced clean
  that every subscriber had not finished handling.

Every check also asserts that the group advanced the adapter the way its class asks
for: through ``advance_runs`` when the adapter overrides it (Kafka), else through
``advance`` (:attr:`BrokerHarness.advanced_by` says which; each test prints it). A
bulk adapter is therefore checked on the path it runs in production.

The checks need no pytest and may be awaited directly; :class:`ConformanceSuite`
runs each in its own event loop (``asyncio.run``), so the harness fixture must be
synchronous and create broker resources in :meth:`BrokerHarness.setup`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence

from ackgate import AdvanceOutcome, reject_shared_stream_event
from ackgate.testing._harness import (
    KEY,
    LANES,
    SUBSCRIBERS,
    TIMEOUT,
    Advanced,
    AdvanceLog,
    BrokerHarness,
    Crash,
    Observation,
    RecordingProducer,
    advance_path,
    interleaved,
    run_group,
    run_once,
)

__all__ = [
    "CHECKS",
    "KEY",
    "LANES",
    "SUBSCRIBERS",
    "TIMEOUT",
    "AdvanceLog",
    "Advanced",
    "BrokerHarness",
    "ConformanceSuite",
    "Crash",
    "Observation",
    "RecordingProducer",
    "advance_path",
    "check_cancel_and_restart",
    "check_failed_is_redelivered",
    "check_nothing_lost",
    "check_order_after_redelivery",
    "check_order_per_lane",
    "check_reject_goes_to_dlq",
    "interleaved",
    "run_check",
]


def _lane_numbers(bodies: Sequence[str]) -> dict[str, list[int]]:
    lanes: dict[str, list[int]] = {lane: [] for lane in LANES}
    for body in bodies:
        lane, n = body.split(":")
        lanes[lane].append(int(n))
    return lanes


async def check_nothing_lost(harness: BrokerHarness) -> None:
    """Three subscribers each see every message; each is advanced clean, acked by all."""
    messages = interleaved(8)
    bodies = {body for _, body in messages}
    run = await run_once(harness, messages, lambda log: log.clean() >= bodies)
    for sid, seen in run.seen.items():
        assert set(seen) == bodies, sid
    assert run.log.clean() == bodies
    assert all(item.outcome.acked == len(SUBSCRIBERS) for item in run.log.items)


async def check_order_per_lane(harness: BrokerHarness) -> None:
    """Within a lane, every subscriber is handed, and ackgate advances, messages in
    publish order; the adapter's lane keeps each lane together and the lanes apart."""
    per_lane = 10
    messages = interleaved(per_lane)
    bodies = {body for _, body in messages}
    run = await run_once(harness, messages, lambda log: log.clean() >= bodies)
    expected = {lane: list(range(per_lane)) for lane in LANES}
    for sid, seen in run.seen.items():
        assert _lane_numbers(seen) == expected, sid
    assert _lane_numbers([item.body for item in run.log.items]) == expected
    adapter_lanes: dict[str, set[Hashable]] = {lane: set() for lane in LANES}
    for item in run.log.items:
        adapter_lanes[item.body.split(":")[0]].add(item.lane)
    assert all(len(lanes) == 1 for lanes in adapter_lanes.values()), adapter_lanes
    assert len(set.union(*adapter_lanes.values())) == len(LANES), adapter_lanes


async def check_reject_goes_to_dlq(harness: BrokerHarness) -> None:
    """A message one subscriber rejects lands in the DLQ and is not delivered again."""
    messages = interleaved(4)
    bodies = {body for _, body in messages}
    rejected = {"a:1", "c:2"}

    def reject(sid: str, body: str) -> None:
        if sid == SUBSCRIBERS[0] and body in rejected:
            reject_shared_stream_event()

    run = await run_once(
        harness, messages, lambda log: {item.body for item in log.items} >= bodies, reject
    )
    for sid, seen in run.seen.items():
        assert Counter(seen) == Counter(bodies), sid  # each exactly once
    assert Counter(item.body for item in run.log.items) == Counter(bodies)
    for item in run.log.items:
        if item.body in rejected:
            assert item.outcome == AdvanceOutcome(acked=2, failed=0, rejected=1), item
        else:
            assert item.outcome.is_clean, item
    async with asyncio.timeout(harness.timeout):
        dead = await harness.dead_lettered(len(rejected))
    assert sorted(dead) == sorted(rejected)


async def check_failed_is_redelivered(harness: BrokerHarness) -> None:
    """A message whose handler crashed is delivered again, then advanced clean."""
    messages = interleaved(4)
    bodies = {body for _, body in messages}
    victim = "b:1"
    crashed: list[str] = []

    def crash_once(sid: str, body: str) -> None:
        if sid == SUBSCRIBERS[0] and body == victim and not crashed:
            crashed.append(sid)
            raise Crash

    def redelivered(log: AdvanceLog) -> bool:
        outcomes = [item.outcome for item in log.items if item.body == victim]
        failed = [i for i, outcome in enumerate(outcomes) if outcome.failed]
        return (
            bool(failed)
            and any(outcome.is_clean for outcome in outcomes[failed[0] :])
            and log.clean() >= bodies
        )

    run = await run_once(harness, messages, redelivered, crash_once)
    assert crashed == [SUBSCRIBERS[0]]
    # The first advance of the victim counts the crash; a later one is clean.
    victim_outcomes = [item.outcome for item in run.log.items if item.body == victim]
    assert victim_outcomes[0].failed == 1, victim_outcomes
    assert any(outcome.is_clean for outcome in victim_outcomes[1:]), victim_outcomes
    # Leaving with an exception fails what was queued for the crasher too; every failed
    # message came back and was advanced clean after all.
    assert run.log.clean() == bodies
    for sid, seen in run.seen.items():
        assert set(seen) == bodies, sid
    # Handed out again to the crasher. The others get the copy too unless the adapter
    # names its events (get_event_id, or ids in its batches): then it passes them,
    # as they acked it already (docs/concepts.md#redelivery-memory).
    assert Counter(run.seen[SUBSCRIBERS[0]])[victim] >= 2


async def check_order_after_redelivery(harness: BrokerHarness) -> None:
    """After a crash fails a message, its lane is handed out again from that message
    on: every lane is advanced clean exactly once per message, in publish order, and
    each subscriber still first meets each lane's messages in publish order."""
    per_lane = 6
    messages = interleaved(per_lane)
    bodies = {body for _, body in messages}
    victim = "b:1"
    crashed: list[str] = []

    def crash_once(sid: str, body: str) -> None:
        if sid == SUBSCRIBERS[0] and body == victim and not crashed:
            crashed.append(sid)
            raise Crash

    run = await run_once(harness, messages, lambda log: log.clean() >= bodies, crash_once)
    assert crashed == [SUBSCRIBERS[0]]
    clean = [item.body for item in run.log.items if item.outcome.is_clean]
    expected = {lane: list(range(per_lane)) for lane in LANES}
    assert _lane_numbers(clean) == expected, clean
    for sid, seen in run.seen.items():
        assert _lane_numbers(list(dict.fromkeys(seen))) == expected, (sid, seen)
    assert not run.log.unearned, run.log.unearned


async def check_cancel_and_restart(harness: BrokerHarness) -> None:
    """Cancel every subscriber mid-stream (mid-event for some), close the group, then
    start a new group on the same source: every message is advanced clean by one of
    the two groups, none is advanced clean before all three subscribers of its group
    finished handling it, and the broker ends with nothing unadvanced."""
    messages = interleaved(10)
    bodies = {body for _, body in messages}
    async with asyncio.timeout(2 * harness.timeout):
        await harness.publish(messages)
        log = AdvanceLog()
        await run_group(
            harness,
            log,
            lambda log: len(log.clean()) >= len(bodies) // 3,
            handling=0.02,
            drain=False,
        )
        first = log.clean()
        assert first < bodies, "the first group was not stopped mid-stream"
        log.new_group()
        await run_group(harness, log, lambda log: log.clean() >= bodies, handling=0.0)
        assert await harness.unadvanced() == 0
    assert log.clean() == bodies
    assert not log.unearned, log.unearned
    log.check_path()


CHECKS: dict[str, Callable[[BrokerHarness], Awaitable[None]]] = {
    "nothing_lost": check_nothing_lost,
    "order_per_lane": check_order_per_lane,
    "reject_goes_to_dlq": check_reject_goes_to_dlq,
    "failed_is_redelivered": check_failed_is_redelivered,
    "order_after_redelivery": check_order_after_redelivery,
    "cancel_and_restart": check_cancel_and_restart,
}


async def run_check(
    check: Callable[[BrokerHarness], Awaitable[None]], harness: BrokerHarness
) -> None:
    """``setup()``, the check, ``teardown()`` (also when the check fails)."""
    await harness.setup()
    try:
        await check(harness)
    finally:
        await harness.teardown()


class ConformanceSuite:
    """The whole suite as pytest tests: subclass it (the subclass's name starting with
    ``Test``) and define a ``harness`` fixture returning a new :class:`BrokerHarness`
    per test. Each test runs its check in a fresh event loop, so the suite needs no
    asyncio plugin and works in any ``asyncio_mode``."""

    @staticmethod
    def _check(name: str, harness: BrokerHarness) -> None:
        asyncio.run(run_check(CHECKS[name], harness))
        # Shown by pytest -rP (and with a failure's output): which advance path ran.
        print(f"conformance {name}: advanced through {harness.advanced_by}")

    def test_nothing_lost(self, harness: BrokerHarness) -> None:
        self._check("nothing_lost", harness)

    def test_order_per_lane(self, harness: BrokerHarness) -> None:
        self._check("order_per_lane", harness)

    def test_reject_goes_to_dlq(self, harness: BrokerHarness) -> None:
        self._check("reject_goes_to_dlq", harness)

    def test_failed_is_redelivered(self, harness: BrokerHarness) -> None:
        self._check("failed_is_redelivered", harness)

    def test_order_after_redelivery(self, harness: BrokerHarness) -> None:
        if not harness.keeps_lane_order_on_redelivery:
            import pytest

            pytest.skip(f"the harness says its broker does not: {harness.order_caveat}")
        self._check("order_after_redelivery", harness)

    def test_cancel_and_restart(self, harness: BrokerHarness) -> None:
        self._check("cancel_and_restart", harness)
