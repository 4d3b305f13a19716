"""The lane tracker: ordered per-lane advancing of resolved runs.

Each lane keeps its outstanding runs (:mod:`ackgate._core.fanout`) in fan-out order. A lane
becomes *ready* when its first run is fully resolved; only then is it put on the
ready queue, so no wake-up ever scans the lanes. Advancers (at most
``max_concurrent_advances`` of them) take ready lanes one at a time, cut the
lane's contiguous resolved prefix into a batch and hand it to the producer: as
:class:`~ackgate.AdvanceRun` s to a producer that overrides ``advance_runs``, else
as one :class:`~ackgate.AdvanceItem` per event.

Invariants:

* a lane is on the ready queue at most once (``Lane.queued``), and never while
  its batch is in flight (``Lane.in_flight``): one advance per lane at a time;
* batches leave a lane from its front only, so within a lane runs (and their
  events) are advanced in fan-out order and each batch is a contiguous prefix;
* after ``halt()`` (an advance raised, or the group is torn down) no new batch is
  started on any lane, and no advancer is created;
* ``outstanding <= max_outstanding`` (docs/production.md#max_outstanding): the group's poll waits in
  :meth:`LaneTracker.wait_for_room` before it broadcasts more
  (``tests/core/test_max_outstanding.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from ackgate._contract.outcome import AdvanceItem, AdvanceOutcome, AdvanceRun
from ackgate._contract.producer import SharedStreamProducer, overrides
from ackgate._core.fanout import Lane, Run

logger = logging.getLogger("ackgate.tracker")

_IDLE_LANES_KEPT = 4096
_OUTCOMES_CACHED = 4096
_outcomes: dict[tuple[int, int, int], AdvanceOutcome] = {}


def _outcome(
    acked: int, failed: int, rejected: int, reasons: tuple[str, ...] = ()
) -> AdvanceOutcome:
    """Outcomes are immutable and few distinct ones occur without reasons: share those."""
    if reasons:
        return AdvanceOutcome(acked, failed, rejected, reasons)
    key = (acked, failed, rejected)
    outcome = _outcomes.get(key)
    if outcome is None:
        outcome = AdvanceOutcome(acked, failed, rejected)
        if len(_outcomes) < _OUTCOMES_CACHED:
            _outcomes[key] = outcome
    return outcome


_new_item = tuple.__new__


def _texts(reasons: list[tuple[int, str]]) -> tuple[str, ...]:
    """Reject reasons in subscription order."""
    return tuple(text for _, text in sorted(reasons))


class LaneTracker:
    """Owns the lanes of one ack-mode group and the tasks that advance them."""

    def __init__(
        self,
        max_concurrent_advances: int,
        on_advance_error: Callable[[BaseException], None],
        max_outstanding: int,
    ) -> None:
        self.lanes: dict[Hashable, Lane] = {}
        #: Events broadcast and not yet advanced. Invariant: ``<= max_outstanding``
        #: (the poll waits for room before it broadcasts one more).
        self.outstanding = 0
        self.max_outstanding = max_outstanding
        #: Reject reasons of runs not advanced yet, per run index (``None``: every
        #: event of the run), as ``(subscription order, "<subscriber_id>: <reason>")``.
        #: Only runs rejected with a reason have an entry, so the common case costs
        #: nothing per run.
        self.reasons: dict[Run, dict[int | None, list[tuple[int, str]]]] = {}
        #: The marks of runs not advanced yet (``Run``: how single events of a run
        #: of several were failed or rejected alone), per run index, as ``[failed,
        #: rejected]``. Only runs with such an event have an entry.
        self.marks: dict[Run, dict[int, list[int]]] = {}
        #: Set while the poll waits for ``outstanding`` to drop below the limit.
        self._room: asyncio.Future[None] | None = None
        self.advanced_events = 0
        self.advance_calls = 0
        self.in_flight_calls = 0
        self.producer: SharedStreamProducer | None = None
        self._cap = max_concurrent_advances
        self._on_advance_error = on_advance_error
        self._ready: deque[Lane] = deque()
        self._advancers: set[asyncio.Task[None]] = set()
        self._idle_advancers = 0
        self._work = asyncio.Event()
        self._quiet = asyncio.Event()  # no ready lane and no call in flight
        self._quiet.set()
        self.halted = False
        self._idle_lanes = 0  # an upper bound of the empty lanes in ``lanes``

    def resolved(self, run: Run) -> None:
        """Called once when ``run.pending`` drops to zero."""
        lane = run.lane
        assert lane is not None
        if lane.runs and lane.runs[0] is run:
            self._maybe_ready(lane)

    def _maybe_ready(self, lane: Lane) -> None:
        if lane.queued or lane.in_flight is not None or self.halted or self.producer is None:
            return
        lane.queued = True
        self._ready.append(lane)
        self._quiet.clear()
        if self._idle_advancers:  # a busy advancer finds the lane before it waits again
            self._work.set()
        self._add_advancers()

    def _add_advancers(self) -> None:
        """Start advancers until every ready lane has one, within ``max_concurrent_advances``."""
        while len(self._advancers) < self._cap and len(self._ready) > self._idle_advancers:
            task = asyncio.get_running_loop().create_task(self._advancer())
            self._advancers.add(task)
            task.add_done_callback(self._advancer_ended)

    def _advancer_ended(self, task: asyncio.Task[None]) -> None:
        self._advancers.discard(task)
        if task.cancelled() and not self.halted:
            # Cancelled from outside, not by ``drain`` (it halts first): asyncio.run()
            # cancels every task when main() ends. The lanes it would have advanced
            # are still ready, and the group's stop waits for them
            # (tests/core/test_shutdown.py::test_advances_survive_their_advancers_cancellation).
            self._add_advancers()

    async def _advancer(self) -> None:
        producer = self.producer
        assert producer is not None
        bulk = overrides(producer, "advance_runs")
        ready = self._ready
        while True:
            while not ready:
                self._idle_advancers += 1
                self._work.clear()
                try:
                    await self._work.wait()
                finally:
                    self._idle_advancers -= 1
            lane = ready.popleft()
            lane.queued = False
            if self.halted:
                self._check_quiet()
                continue
            batch: list[Run] = []
            runs = lane.runs
            while runs and runs[0].pending == 0:
                batch.append(runs.popleft())
            assert batch, "a ready lane has a resolved first run"
            lane.in_flight = batch
            self.in_flight_calls += 1
            units, advanced = self._units(batch, bulk)
            try:
                if bulk:
                    await producer.advance_runs(units)
                else:
                    await producer.advance(units)
            except asyncio.CancelledError as exc:
                self.in_flight_calls -= 1
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    self._check_quiet()
                    raise  # the group's own cancellation (drain, loop teardown)
                # Raised by advance() itself: a failure like any other, not a stop.
                self._failed(exc)
                return
            except Exception as exc:
                self.in_flight_calls -= 1
                self._failed(exc)
                return
            except BaseException:
                self.in_flight_calls -= 1
                self._check_quiet()
                raise
            self.in_flight_calls -= 1
            self.advance_calls += 1
            self.advanced_events += advanced
            self.outstanding -= advanced
            if self._room is not None:
                self._wake_poll()
            lane.in_flight = None
            # An idle advancer must hold no events (nor their payloads).
            del batch, units
            if runs:
                if runs[0].pending == 0:
                    self._maybe_ready(lane)
            else:
                self._idle_lanes += 1
                if self._idle_lanes > _IDLE_LANES_KEPT and 2 * self._idle_lanes > len(self.lanes):
                    self._forget_idle_lanes()
            self._check_quiet()

    def _units(self, batch: list[Run], bulk: bool) -> tuple[list[Any], int]:
        """What ``advance_runs`` (``bulk``) or ``advance`` is called with for ``batch``,
        and how many events that is."""
        events = 0
        units: list[Any] = []
        for run in batch:
            events += run.count
            if bulk:
                units.append(self._advance_run(run))
            elif run.count == 1 and run not in self.reasons:
                # The per-event producer's case, once per event: kept flat.
                failed, rejected = run.failed, run.rejected
                units.append(
                    _new_item(
                        AdvanceItem,
                        (
                            run.payloads,  # a run of one: the payload itself
                            _outcome(run.snapshot - failed - rejected, failed, rejected),
                        ),
                    )
                )
            else:
                units.extend(self._advance_run(run).items())
        return units, events

    def _advance_run(self, run: Run) -> AdvanceRun:
        """``run`` as the producer is told of it: one outcome for its events, and the
        outcomes of the events a subscriber resolved alone (its marks; a reason for
        one event only comes with a mark, ``Group.mark``)."""
        failed, rejected, snapshot = run.failed, run.rejected, run.snapshot
        reasons = self.reasons.pop(run, None) or {}
        whole = reasons.get(None, [])
        outcome = _outcome(snapshot - failed - rejected, failed, rejected, _texts(whole))
        marks = self.marks.pop(run, None)
        if marks is None:
            return AdvanceRun(run.broker_payloads(), outcome)
        exceptions: dict[int, AdvanceOutcome] = {}
        for index in sorted(marks):
            event_failed = failed + marks[index][0]
            event_rejected = rejected + marks[index][1]
            own = reasons.get(index)
            exceptions[index] = _outcome(
                snapshot - event_failed - event_rejected,
                event_failed,
                event_rejected,
                _texts(whole + own) if own else outcome.reasons,
            )
        return AdvanceRun(run.broker_payloads(), outcome, exceptions)

    def _failed(self, exc: BaseException) -> None:
        self.halt()
        self._on_advance_error(exc)
        self._check_quiet()

    def _forget_idle_lanes(self) -> None:
        """Drop empty lanes once they are both thousands and half of the dict: lanes
        are reused while they are busy, and the dict stays bounded (by twice the
        lanes with outstanding events, at most ``max_outstanding``) when lane keys
        never repeat (SQS). Amortized O(1) per advanced lane."""
        self.lanes = {
            key: lane for key, lane in self.lanes.items() if lane.runs or lane.in_flight is not None
        }
        self._idle_lanes = 0

    def _check_quiet(self) -> None:
        if self.in_flight_calls == 0 and (self.halted or not self._ready):
            self._quiet.set()

    def start(self, producer: SharedStreamProducer) -> None:
        """Begin advancing (the producer exists from now on)."""
        self.producer = producer
        for lane in self.lanes.values():
            if lane.runs and lane.runs[0].pending == 0:
                self._maybe_ready(lane)

    def halt(self) -> None:
        """Start no further batch (nor advancer) on any lane. Calls in flight run to
        completion. Wakes a poll waiting for room: nothing will make room any more."""
        self.halted = True
        self._ready.clear()
        self._check_quiet()
        self._wake_poll()

    async def drain(self) -> None:
        """Wait until every resolved prefix is advanced (or the tracker halted) and
        no call is in flight, then halt and stop the advancers: on return no call is in
        flight, none will start, and no advancer task is left.

        Resolutions that land while this waits are advanced too; later ones are not.
        Cancellation: the tracker halts and the advancers are cancelled with the
        caller (a call in flight is cancelled then: only on loop teardown).
        """
        try:
            # A resolution can make a lane ready between the wake-up and this task
            # running: wait again until quiet holds when this task looks.
            while not self._quiet.is_set():
                await self._quiet.wait()
        finally:
            # Halting first, in the same step that saw quiet: no call is in flight and
            # no new advancer can start while the idle ones are cancelled below.
            self.halt()
            for task in list(self._advancers):
                task.cancel()
            if self._advancers:
                await asyncio.gather(*self._advancers, return_exceptions=True)
        assert not self._advancers and self.in_flight_calls == 0

    async def wait_for_room(self) -> None:
        """Caller: the poll, at ``max_outstanding``. Returns once an advance brought
        ``outstanding`` below the limit, or the tracker halted.

        Cancellation: returns nothing, changes nothing (the group's stop cancels it).
        """
        while self.outstanding >= self.max_outstanding and not self.halted:
            room = self._room = asyncio.get_running_loop().create_future()
            try:
                await room
            finally:
                self._room = None

    def _wake_poll(self) -> None:
        room = self._room
        if (
            room is not None
            and not room.done()
            and (self.halted or self.outstanding < self.max_outstanding)
        ):
            room.set_result(None)

    def oldest_run(self) -> Run | None:
        """The run broadcast first among those not advanced yet (the first in stream
        order among those broadcast at the same time). O(lanes)."""
        oldest: Run | None = None
        for lane in self.lanes.values():
            if lane.in_flight:
                first = lane.in_flight[0]
            elif lane.runs:
                first = lane.runs[0]
            else:
                continue
            if oldest is None or (first.broadcast_at, first.position) < (
                oldest.broadcast_at,
                oldest.position,
            ):
                oldest = first
        return oldest
