"""Test doubles for code built on ackgate: a producer a test scripts, and a clock.

>>> producer = ScriptedProducer(lane=lambda payload: payload % 2)
>>> producer.feed("event-0", 0)  # broadcast once a group polls it

:class:`ScriptedRunsProducer` is the same producer advanced by runs (it overrides
``advance_runs``), for testing code on the path a bulk adapter such as Kafka's takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import Any

from ackgate._contract.outcome import AdvanceItem, AdvanceRun
from ackgate._contract.producer import SharedStreamProducer

_END = object()


class ScriptedProducer(SharedStreamProducer):
    """A producer whose stream a test feeds by hand and whose advances it records.

    ``feed(raw, payload)`` queues one event; ``end()`` makes the stream return;
    ``fail(exc)`` makes it raise. Every ``advance`` batch is appended to
    ``batches``; set ``advance_error`` to make the next advance raise it, or
    ``advance_gate`` to an ``asyncio.Event`` that advances wait for. Create it
    inside the event loop that runs the group.
    """

    def __init__(self, lane: Callable[[Any], Hashable] | None = None) -> None:
        self._lane = lane
        self._items: asyncio.Queue[Any] | None = None
        self._pending: list[Any] = []
        self.batches: list[list[AdvanceItem]] = []
        #: One entry per ``advance_runs`` call, as given (:class:`ScriptedRunsProducer`).
        self.runs: list[list[AdvanceRun]] = []
        self.advance_error: BaseException | None = None
        self.advance_gate: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.opened = 0
        self.stream_closed = 0
        self.closed = 0
        self.advanced = asyncio.Condition()
        #: Set while the stream waits for the test to feed it: all fed items were yielded.
        self.starved = asyncio.Event()

    def _queue(self) -> asyncio.Queue[Any]:
        if self._items is None:
            self._items = asyncio.Queue()
            for item in self._pending:
                self._items.put_nowait(item)
            self._pending.clear()
        return self._items

    def feed(self, raw: Any, payload: Any = None) -> None:
        self._put((raw, payload))

    def feed_item(self, item: Any) -> None:
        """Queue anything, even something that is not a pair."""
        self._put(("item", item))

    def end(self) -> None:
        self._put(_END)

    def fail(self, error: BaseException) -> None:
        self._put(error)

    def _put(self, item: Any) -> None:
        self.starved.clear()
        try:
            self._queue().put_nowait(item)
        except RuntimeError:  # no running loop yet
            self._pending.append(item)

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self.opened += 1
        queue = self._queue()
        try:
            while True:
                if queue.empty():
                    self.starved.set()
                item = await queue.get()
                self.starved.clear()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, tuple) and len(item) == 2 and item[0] == "item":
                    yield item[1]
                    continue
                yield item
        finally:
            self.stream_closed += 1

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return None if self._lane is None else self._lane(broker_payload)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        await self._advanced(list(batch), None)

    async def _advanced(self, items: list[AdvanceItem], runs: list[AdvanceRun] | None) -> None:
        """Record one advance call (``runs`` when it came by ``advance_runs``), after
        ``advance_gate`` and ``advance_error`` had their say."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.advance_gate is not None:
                await self.advance_gate.wait()
            if self.advance_error is not None:
                error, self.advance_error = self.advance_error, None
                raise error
            self.batches.append(items)
            if runs is not None:
                self.runs.append(runs)
        finally:
            self.in_flight -= 1
        async with self.advanced:
            self.advanced.notify_all()

    async def wait_advanced(self, count: int) -> None:
        """Wait until at least ``count`` events were advanced in total."""
        async with self.advanced:
            await self.advanced.wait_for(lambda: self.advanced_count >= count)

    @property
    def advanced_count(self) -> int:
        return sum(len(batch) for batch in self.batches)

    @property
    def advanced_payloads(self) -> list[Any]:
        return [item.broker_payload for batch in self.batches for item in batch]

    async def aclose(self) -> None:
        self.closed += 1


class ScriptedRunsProducer(ScriptedProducer):
    """:class:`ScriptedProducer` advanced by runs: it overrides ``advance_runs``, so a
    group hands it :class:`~ackgate.AdvanceRun` s instead of calling ``advance``.

    Each call's runs are appended to ``runs`` as given; ``batches`` (and so
    ``advanced_payloads``, ``advanced_count``, ``wait_advanced``) still get one list
    of items per call, the runs expanded, so a test reads either. ``advance_error``
    and ``advance_gate`` work as for ``advance``.

    >>> producer = ScriptedRunsProducer()
    >>> producer.feed("event-0", 0)
    """

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        runs = list(runs)
        await self._advanced([item for run in runs for item in run.items()], runs)


class FakeClock:
    """A monotonic clock a test moves by hand: ``SharedStreamManager(clock=clock)``.

    :meth:`advance` makes every ack timeout that falls due fire then, without real
    waiting and without a later pull or broadcast: each group's timer waits on
    :meth:`sleep_until`, which :meth:`advance` resolves. The expiry itself runs on
    the event loop's next turn, so after ``clock.advance(seconds)`` a test awaits
    exactly one ``await asyncio.sleep(0)``; then every subscriber that owed an
    expired event is force-failed (counted ``failed``, its next pull raises
    ``AckTimeout``). The advances this frees run in later turns, as usual:
    await them (``ScriptedProducer.wait_advanced``).

    >>> clock = FakeClock()
    >>> clock.advance(60.0)
    >>> clock()
    1060.0

    One clock may serve several managers and event loops; call :meth:`advance`
    from the thread that runs them.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        #: Futures of :meth:`sleep_until` callers not woken yet, with their deadlines.
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` and wake every :meth:`sleep_until`
        whose deadline is reached (see the class docstring for what to await)."""
        self.now += seconds
        waiting = []
        for deadline, future in self._sleepers:
            if future.done():  # its waiter was cancelled: forget it
                continue
            if deadline <= self.now:
                future.set_result(None)
            else:
                waiting.append((deadline, future))
        self._sleepers = waiting

    async def sleep_until(self, deadline: float) -> None:
        """Return once the clock reads ``deadline`` or later: when :meth:`advance`
        gets there, never on real time. Caller: a group's ack-timeout timer.

        Cancellation: returns nothing; the clock forgets the waiter on its next move.
        """
        if self.now >= deadline:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((deadline, future))
        await future
