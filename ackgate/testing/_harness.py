"""The conformance kit's machinery: the harness contract and one run of a group.

:mod:`ackgate.testing.conformance` (the public face) re-exports what an adapter
author needs; the checks there are built from :func:`run_once` and :func:`run_group`.
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
    AdvanceRun,
    EventBatch,
    SharedStreamManager,
    SharedStreamProducer,
    Subscription,
)
from ackgate._contract.producer import overrides

LANES = ("a", "b", "c")
"""The harness's lane names: a Kafka/memory partition, an SQS message group, a
Pub/Sub ordering key, a Service Bus session."""

SUBSCRIBERS = ("s0", "s1", "s2")
TIMEOUT = 60.0
KEY = "conformance"


class BrokerHarness(ABC):
    """One adapter over its broker, as the checks need it: a fresh source (topic, queue,
    subscription) with a dead-letter destination, per harness.

    Every method may be awaited under ``asyncio.timeout``; none needs cleaning up after
    cancellation. All run in the check's event loop, so a harness opens any client
    in :meth:`setup` (or per call), never in ``__init__``.
    """

    keeps_lane_order_on_redelivery: bool = True
    """Whether the broker hands a lane out again in publish order after a failed
    message (Kafka partitions, SQS FIFO groups, Pub/Sub ordering keys, Service Bus
    sessions do). ``False`` skips :func:`check_order_after_redelivery`, naming
    :attr:`order_caveat`."""

    order_caveat: str = ""

    timeout: float = TIMEOUT
    """Seconds a check may take (and the ack timeout of its manager); a check that
    runs out fails with ``TimeoutError``."""

    advanced_by: str | None = None
    """Set by the checks: the method the group advanced the adapter's producer through
    (``"advance"``, or ``"advance_runs"`` when its class overrides it)."""

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Create the source and the DLQ; called once, before the check publishes."""

    async def teardown(self) -> None:  # noqa: B027 - optional hook
        """Close whatever :meth:`setup` opened; called once, after the check."""

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
        return SharedStreamManager(ack_timeout=self.timeout, max_concurrent_advances=len(LANES))


def advance_path(producer: SharedStreamProducer) -> str:
    """``"advance_runs"`` when a group advances ``producer`` by runs (its class overrides
    ``advance_runs``), else ``"advance"``."""
    if overrides(producer, "advance_runs"):
        return "advance_runs"
    return "advance"


@dataclass(frozen=True)
class Advanced:
    """One item ackgate handed to ``advance``, after the adapter's ``advance`` returned."""

    body: str
    lane: Hashable
    outcome: AdvanceOutcome


class AdvanceLog:
    """Every :class:`Advanced` of a check, in order, with a condition to wait on.

    It also holds what each subscriber of the running group finished handling, and
    records every clean advance of a body some subscriber had not finished handling
    in ``unearned`` (checked by :func:`check_cancel_and_restart`). ``calls`` counts
    the adapter's advance calls by the method the group called (``"advance"`` or
    ``"advance_runs"``); ``path`` is the one the adapter's producer is advanced
    through (:func:`advance_path`), set when the first producer is made.
    """

    def __init__(self) -> None:
        self.items: list[Advanced] = []
        self.calls: Counter[str] = Counter()
        self.path: str | None = None
        self.handled: dict[str, set[str]] = {sid: set() for sid in SUBSCRIBERS}
        self.unearned: list[Advanced] = []
        self._changed = asyncio.Condition()

    def new_group(self) -> None:
        self.handled = {sid: set() for sid in SUBSCRIBERS}

    async def add(self, items: list[Advanced], path: str = "advance") -> None:
        self.calls[path] += 1
        for item in items:
            if item.outcome.is_clean and not all(
                item.body in handled for handled in self.handled.values()
            ):
                self.unearned.append(item)
        async with self._changed:
            self.items.extend(items)
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[list[Advanced]], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.items))

    def clean(self) -> set[str]:
        return {item.body for item in self.items if item.outcome.is_clean}

    def check_path(self) -> None:
        """Every advance went through the method the adapter's producer is advanced by."""
        assert set(self.calls) == {self.path}, (
            f"the group advanced through {dict(self.calls)}; the adapter's producer is "
            f"advanced through {self.path}"
        )


class RecordingProducer(SharedStreamProducer):
    """The adapter's producer, unchanged (its lanes and event ids too), recording what
    ``advance`` was given."""

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

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        return self._inner.get_event_id(broker_payload)

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


class RunsRecordingProducer(RecordingProducer):
    """:class:`RecordingProducer` for an adapter advanced by runs: it overrides
    ``advance_runs`` too, so the group advances it by runs, as it would the adapter."""

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        await self._inner.advance_runs(runs)
        pending = self._pending
        done = [
            (pending.pop(id(payload)), run.outcome_of(index))
            for run in runs
            for index, payload in enumerate(run.broker_payloads)
        ]
        await self._log.add(
            [Advanced(body, lane, outcome) for (_, body, lane), outcome in done], "advance_runs"
        )


class BatchRecordingProducer(RecordingProducer):
    """:class:`RecordingProducer` for an adapter that yields ``EventBatch`` es: the group
    reads its batches, as it would the adapter's, so the checks run on that path."""

    async def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        stream = self._inner.open_stream_batches()
        try:
            async for batch in stream:
                for raw, payload in zip(batch.raw_events, batch.broker_payloads, strict=True):
                    self._pending[id(payload)] = (payload, self._harness.body(raw), batch.lane)
                yield batch
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


class BatchRunsRecordingProducer(BatchRecordingProducer, RunsRecordingProducer):
    """Both: an adapter that yields ``EventBatch`` es and is advanced by runs (Kafka)."""


_WRAPPERS: dict[tuple[bool, bool], type[RecordingProducer]] = {
    (False, False): RecordingProducer,
    (True, False): BatchRecordingProducer,
    (False, True): RunsRecordingProducer,
    (True, True): BatchRunsRecordingProducer,
}


def recording(
    inner: SharedStreamProducer, harness: BrokerHarness, log: AdvanceLog
) -> RecordingProducer:
    """The recording wrapper for ``inner``, reading and advancing it the way a group
    would; ``log.path`` says which advance method that is."""
    batches = overrides(inner, "open_stream_batches")
    log.path = harness.advanced_by = advance_path(inner)
    return _WRAPPERS[batches, log.path == "advance_runs"](inner, harness, log)


def interleaved(per_lane: int) -> list[tuple[str, str]]:
    """``per_lane`` messages per lane, bodies ``"<lane>:<n>"``, lanes interleaved."""
    return [(lane, f"{lane}:{n}") for n in range(per_lane) for lane in LANES]


class Crash(Exception):
    """A handler blowing up mid-event."""


OnEvent = Callable[[str, str], None]
"""Called by a subscriber with (subscriber id, body) for every event it is handed; it
may call ``reject_shared_stream_event()`` or raise :class:`Crash`."""


@dataclass
class Observation:
    """What one check observed: bodies handed to each subscriber, and the advances
    (``log.handled``: what each finished handling)."""

    seen: dict[str, list[str]]
    log: AdvanceLog


async def _stop(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel the subscribers; re-raise anything but cancellation they raised."""
    for task in tasks:
        task.cancel()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def run_group(
    harness: BrokerHarness,
    log: AdvanceLog,
    until: Callable[[AdvanceLog], bool],
    on_event: OnEvent | None = None,
    handling: float = 0.0,
    drain: bool = True,
) -> dict[str, list[str]]:
    """Run one group of :data:`SUBSCRIBERS` until ``until(log)`` holds (and, with
    ``drain``, the broker is fully advanced), cancel them and close the group; return
    the bodies each was handed.

    A subscriber whose ``on_event`` raises :class:`Crash` leaves the group with the
    exception (its open event is failed) and subscribes again. ``handling`` seconds of
    work follow each event, after which the body counts as handled (:attr:`Observation.log`).
    """

    def make() -> SharedStreamProducer:
        return recording(harness.producer(), harness, log)

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
                        if handling:
                            await asyncio.sleep(handling)
                        log.handled[sid].add(body)
                return
            except Crash:
                sub = manager.subscribe(KEY, sid, producer=make)

    async with harness.manager() as manager:
        # Subscribed in one synchronous step: all three are in the first snapshot.
        subs = {sid: manager.subscribe(KEY, sid, producer=make) for sid in SUBSCRIBERS}
        tasks = [asyncio.create_task(consume(subs[sid], sid)) for sid in SUBSCRIBERS]
        try:
            await log.wait_for(lambda _: until(log))
            if drain:
                await harness.wait_fully_advanced()
        finally:
            await _stop(tasks)
    return seen


async def run_once(
    harness: BrokerHarness,
    messages: Sequence[tuple[str, str]],
    done: Callable[[AdvanceLog], bool],
    on_event: OnEvent | None = None,
) -> Observation:
    """Publish, run one group until ``done(log)`` holds and the broker is fully advanced,
    and check the broker holds nothing more."""
    async with asyncio.timeout(harness.timeout):
        await harness.publish(messages)
        log = AdvanceLog()
        seen = await run_group(harness, log, done, on_event)
        assert await harness.unadvanced() == 0
    assert not log.unearned, log.unearned
    log.check_path()
    return Observation(seen, log)
