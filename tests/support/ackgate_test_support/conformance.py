"""One conformance suite for every adapter, run against its real broker.

Each ``tests/adapters/<broker>/test_<broker>_conformance.py`` builds a
:class:`BrokerHarness` from that directory's fixtures and calls the four checks
below, one test each. A check publishes a few tens of messages over :data:`LANES`,
subscribes three subscribers to one ackgate group in one step (so all three are in
every snapshot), lets them run until the broker is fully advanced, stops them
while they wait on their next pull (no window open, so stopping fails nothing),
and then asserts what the subscribers saw, what ackgate handed to ``advance`` and
what the broker holds:

* :func:`check_nothing_lost`: every subscriber sees every message, the broker ends
  with nothing unadvanced.
* :func:`check_order_per_lane`: within a lane every subscriber sees, and ackgate
  advances, messages in publish order; the adapter's lane keeps the lanes apart.
* :func:`check_reject_goes_to_dlq`: a rejected message lands in the adapter's DLQ,
  is advanced once and is not delivered again.
* :func:`check_failed_is_redelivered`: a message whose handler crashed is delivered
  again, then advanced clean.

What ``advance`` received is recorded by :class:`RecordingProducer`, a transparent
wrapper around the adapter's producer.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ackgate import (
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamManager,
    SharedStreamProducer,
    Subscription,
    reject_shared_stream_event,
)

LANES = ("a", "b", "c")
"""The harness's lane names: a Kafka/memory partition, an SQS message group, a
Pub/Sub ordering key, a Service Bus session."""

SUBSCRIBERS = ("s0", "s1", "s2")
TIMEOUT = 60.0
KEY = "conformance"


class BrokerHarness(ABC):
    """One adapter over its broker, as the checks need it. Every method may be awaited
    under ``asyncio.timeout``; none needs cleaning up after cancellation."""

    @abstractmethod
    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        """Publish ``(lane, body)`` pairs in this order; ``lane`` is one of :data:`LANES`
        and messages of one lane must reach the adapter in this order."""

    @abstractmethod
    def producer(self) -> SharedStreamProducer:
        """A new producer on the source, with dead-lettering configured."""

    @abstractmethod
    def body(self, raw: Any) -> str:
        """The body of a raw event as the adapter yields it."""

    @abstractmethod
    async def wait_fully_advanced(self) -> None:
        """Return once the broker holds nothing unacknowledged / uncommitted (while the
        group still runs). Unbounded; callers wrap it in ``asyncio.timeout``."""

    @abstractmethod
    async def unadvanced(self) -> int:
        """After the group stopped: how many messages the broker would deliver again."""

    @abstractmethod
    async def dead_lettered(self, count: int) -> list[str]:
        """Wait until ``count`` messages are in the DLQ; return their bodies."""

    def manager(self) -> SharedStreamManager:
        return SharedStreamManager(ack_timeout=TIMEOUT, max_concurrent_advances=len(LANES))


@dataclass(frozen=True)
class Advanced:
    """One item ackgate handed to ``advance``, after the adapter's ``advance`` returned."""

    body: str
    lane: Hashable
    outcome: AdvanceOutcome


class AdvanceLog:
    """Every :class:`Advanced` of a check, in order, with a condition to wait on."""

    def __init__(self) -> None:
        self.items: list[Advanced] = []
        self._changed = asyncio.Condition()

    async def add(self, items: list[Advanced]) -> None:
        async with self._changed:
            self.items.extend(items)
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[list[Advanced]], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.items))

    def clean(self) -> set[str]:
        return {item.body for item in self.items if item.outcome.is_clean}


class RecordingProducer(SharedStreamProducer):
    """The adapter's producer, unchanged, recording what ``advance`` was given."""

    def __init__(self, inner: SharedStreamProducer, harness: BrokerHarness, log: AdvanceLog):
        self._inner = inner
        self._harness = harness
        self._log = log
        # id(payload) -> (payload, body, lane); the payload is kept so its id stays unique.
        self._pending: dict[int, tuple[Any, str, Hashable]] = {}

    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[tuple[Any, Any]]:
        stream = self._inner.open_stream()
        try:
            async for raw, payload in stream:
                lane = self._inner.get_advance_lane(payload)
                self._pending[id(payload)] = (payload, self._harness.body(raw), lane)
                yield raw, payload
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return self._pending[id(broker_payload)][2]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        await self._inner.advance(batch)
        done = [self._pending.pop(id(item.broker_payload)) for item in batch]
        await self._log.add(
            [
                Advanced(body, lane, item.outcome)
                for (_, body, lane), item in zip(done, batch, strict=True)
            ]
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def interleaved(per_lane: int) -> list[tuple[str, str]]:
    """``per_lane`` messages per lane, bodies ``"<lane>:<n>"``, lanes interleaved."""
    return [(lane, f"{lane}:{n}") for n in range(per_lane) for lane in LANES]


class Crash(Exception):
    """A handler blowing up mid-event."""


OnEvent = Callable[[str, str], None]
"""Called by a subscriber with (subscriber id, body) for every event it is handed; it
may call ``reject_shared_stream_event()`` or raise :class:`Crash`."""


@dataclass
class Run:
    """What one check observed: bodies handed to each subscriber, and the advances."""

    seen: dict[str, list[str]]
    log: AdvanceLog


async def _stop(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel subscribers blocked on their next pull; re-raise anything else they raised."""
    for task in tasks:
        task.cancel()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def _run(
    harness: BrokerHarness,
    messages: Sequence[tuple[str, str]],
    done: Callable[[AdvanceLog], bool],
    on_event: OnEvent | None = None,
) -> Run:
    """Publish, run :data:`SUBSCRIBERS` until ``done(log)`` holds and the broker is fully
    advanced, stop them, close the group, and check the broker holds nothing more.

    A subscriber whose ``on_event`` raises :class:`Crash` leaves the group with the
    exception (its open event is failed) and subscribes again.
    """
    await harness.publish(messages)
    log = AdvanceLog()

    def make() -> SharedStreamProducer:
        return RecordingProducer(harness.producer(), harness, log)

    seen: dict[str, list[str]] = {sid: [] for sid in SUBSCRIBERS}

    async def consume(sub: Subscription, sid: str) -> None:
        while True:
            try:
                async with sub:
                    async for raw in sub:
                        body = harness.body(raw)
                        seen[sid].append(body)
                        if on_event is not None:
                            on_event(sid, body)
                return
            except Crash:
                sub = manager.subscribe(KEY, sid, producer=make)

    async with asyncio.timeout(TIMEOUT):
        async with harness.manager() as manager:
            # Subscribed in one synchronous step: all three are in the first snapshot.
            subs = {sid: manager.subscribe(KEY, sid, producer=make) for sid in SUBSCRIBERS}
            tasks = [asyncio.create_task(consume(subs[sid], sid)) for sid in SUBSCRIBERS]
            try:
                await log.wait_for(lambda _: done(log))
                await harness.wait_fully_advanced()
            finally:
                await _stop(tasks)
        assert await harness.unadvanced() == 0
    return Run(seen, log)


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
    run = await _run(harness, messages, lambda log: log.clean() >= bodies)
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
    run = await _run(harness, messages, lambda log: log.clean() >= bodies)
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

    run = await _run(
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
    async with asyncio.timeout(TIMEOUT):
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

    run = await _run(harness, messages, redelivered, crash_once)
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
        assert Counter(seen)[victim] >= 2, sid  # handed out again, to everyone
