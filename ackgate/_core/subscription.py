"""One subscriber's view of a group: an async iterator of raw events with a window.

The subscription owns its per-subscriber state: its cursor into the group's
fan-out log, the event it is on (its open window), its *parts* (the runs it was
handed some of and has not finished) and the bindings of outputs it derived. State
shared by every subscriber (the log, the lanes, the resolution counts) belongs to
the group.

Parts: a subscriber's part in a run resolves once it is done with every event of
the run. ``_parts[run]`` is ``[holds, marked]``: ``holds`` counts what keeps the
part open, namely one *walk* hold from the first hand-out of the run until nothing
more of it is handed out and the window on its events is closed, one
per unconfirmed output bound to one of its events, and one per live batch binding
with events of it; ``marked`` has bit ``i`` set once this subscriber rejected or
failed the run's event ``i`` (its acks of the others are remembered for
redelivery). When ``holds`` drops to 0 the group counts the part resolved
(``Group.release``). A run of one event handed
by a pull (an event yielded alone) has no entry: its window and its outputs
(``_outputs[run]``) hold it, and the last of them to go resolves it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Hashable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol

from ackgate._contract.checks import check_int
from ackgate._contract.errors import StreamTerminated
from ackgate._core.bindings import BatchBinding, BoundBatch, EventRef, OutputRegistry
from ackgate._core.fanout import EventLog, Resolution, Run
from ackgate._core.redelivery import _Spanned

logger = logging.getLogger("ackgate.subscription")

#: The subscription whose event the current task was last handed.
_current_subscription: ContextVar[Subscription | None] = ContextVar(
    "ackgate_current_subscription", default=None
)


def reject_shared_stream_event(reason: str | None = None) -> None:
    """Reject the event the calling task is on: it resolves as ``rejected`` at once.

    Call it from the task iterating the subscription (or from code that task
    awaits). ``reason`` (a ``str``, else ``TypeError``) reaches the producer as
    ``"<subscriber_id>: <reason>"`` in the event's ``AdvanceOutcome.reasons``.
    Outside an ack-mode window it logs a warning and does nothing; on an event
    already resolved for this subscriber it does nothing.
    """
    _check_reason(reason)
    subscription = _current_subscription.get()
    if subscription is None:
        logger.warning("reject_shared_stream_event() called outside a shared stream window")
        return
    subscription.reject(reason)


def _check_reason(reason: object) -> None:
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"reason must be a str or None, got {type(reason).__name__}")


class GroupSide(Protocol):
    """The group (``ackgate._core.group.Group``) as its subscriptions see it: the state
    every subscriber shares, and how a subscriber's resolutions reach it."""

    key: Hashable
    ack_mode: bool
    bindings: OutputRegistry
    log: EventLog
    #: Runs broadcast and not resolved yet, oldest first (the ack timeout's order).
    unresolved: deque[Run]
    waiters: set[asyncio.Future[None]]
    clock: Callable[[], float]
    ack_timeout: float
    blocked: bool
    room: asyncio.Event
    terminal: tuple[type[StreamTerminated], str, BaseException | None] | None
    departed: set[Subscription]
    redeliveries_skipped_by: dict[Hashable, int]
    #: The group's stop, once it began (``leave`` returns it to the last member).
    stop_task: asyncio.Task[None] | None

    def terminal_error(self) -> StreamTerminated: ...

    def stop_polling(self) -> None: ...

    def expire(self) -> None: ...

    def leave(self, sub: Subscription, *, crashed: bool) -> asyncio.Task[None] | None: ...

    def release(self, sub: Subscription, run: Run, holds: int = 1) -> None: ...

    def part_done(self, sub: Subscription, run: Run, marked: int) -> None: ...

    def mark(
        self, sub: Subscription, run: Run, index: int, how: Resolution, reason: str | None
    ) -> None: ...

    def resolve_binding(
        self, sub: Subscription, binding: BatchBinding, how: Resolution, reason: str | None
    ) -> None: ...

    def skip_at_hand_out(self, run: Run, sub: Subscription, flag: int) -> None: ...


class Subscription:
    """A subscriber's membership in a group; iterate it to receive raw events.

    Each ``async for`` step closes the window on the previous event and opens one
    on the next. Leave with ``async with`` so a crash is seen: exiting with an
    exception (cancellation included) fails the event you are on, exiting cleanly
    (or :meth:`aclose`) means you are done with it.
    """

    def __init__(self, group: GroupSide, subscriber_id: Hashable, position: int) -> None:
        self._group = group
        self._registry = group.bindings
        self.key: Hashable = group.key
        self.subscriber_id = subscriber_id
        #: First stream position whose snapshot includes this subscriber.
        self._joined_at = position
        #: Next stream position to hand out. Invariant: ``_joined_at <= _cursor <= log.head``.
        self._cursor = position
        #: Index of the run holding ``_cursor`` (``log.next_seq`` at the head).
        #: Invariant: a subscriber joins at a run boundary, so it enters every run
        #: it reads at the run's first event.
        self._seq = group.log.next_seq
        #: The run whose event's window is open, if any, and that event's index.
        self._current: Run | None = None
        self._current_index = 0
        #: Whether this subscriber's part in the open event is already resolved.
        self._current_resolved = False
        #: Runs this subscriber was handed events of and whose part is not resolved
        #: (but runs of one event not in a batch binding): ``[holds, marked]`` (module
        #: docstring). Invariant: ``holds >= 1``.
        self._parts: dict[Run, list[int]] = {}
        #: Unconfirmed outputs per event not resolved yet, the open window's
        #: included, keyed by the run for a run of one event, else ``(run, index)``.
        #: Invariant: never holds an event this subscriber resolved.
        self._outputs: dict[EventRef, int] = {}
        #: Live batch bindings (``pull_batch``), in binding order. Invariant: an event
        #: is owed through at most one of ``_outputs`` and a binding here.
        self._batches: dict[BatchBinding, None] = {}
        #: Set when force-failed: what the next pull raises.
        self._failure: Exception | None = None
        self._left = False
        self._waiter: asyncio.Future[None] | None = None
        #: Set by the group once a pull would raise (force-failed, the group ended)
        #: or the subscription left: what :meth:`wait_failed` waits for. Made on demand.
        self._unusable: asyncio.Event | None = None
        #: This subscriber id's bit in the group's redelivery memory (None: none).
        self._bit: int | None = None
        #: Subscription order: how many subscriptions the group had before this one
        #: (set by ``Group.join``). Orders the reject reasons of an outcome.
        self._order = 0

    def __repr__(self) -> str:
        return f"<Subscription key={self.key!r} subscriber_id={self.subscriber_id!r}>"

    # -- iteration ---------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Any:
        """Close the window on the current event and hand out the next one.

        Raises ``AckTimeout`` / ``SubscriberOverflow`` once force-failed,
        ``StreamTerminated`` / ``AdvanceFailed`` once the group ended, and
        ``StopAsyncIteration`` after the subscription was closed. Cancellation
        while waiting hands out nothing and changes nothing.
        """
        # The hot path of the whole library: once per event per subscriber. Kept
        # flat on purpose (the log lookup and the hand-out are inlined).
        group = self._group
        if self._left:
            raise StopAsyncIteration
        ack_mode = group.ack_mode
        if ack_mode:
            unresolved = group.unresolved
            if unresolved and group.clock() - unresolved[0].broadcast_at >= group.ack_timeout:
                group.expire()
            current = self._current
            if current is not None:
                if current.count == 1 and not self._current_resolved:
                    # ``_close_window``, inlined for the per-event path's runs of one.
                    self._current = None
                    if current not in self._outputs:
                        group.part_done(self, current, 0)
                else:
                    self._close_window(current)
        log = group.log
        while True:
            if self._failure is not None:
                raise self._failure
            if group.terminal is not None:
                raise group.terminal_error()
            cursor = self._cursor
            if cursor < log.head:
                run = log.entries[self._seq - log.base]
                count = run.count
                index = cursor - run.position
                if index == 0:
                    if run.skipped is not None and ack_mode and self._acked_earlier_copy(run):
                        # Counted acked (it acked an earlier copy): pass it. A poll
                        # waiting for room may be waiting for exactly this cursor.
                        self._pass(run)
                        continue
                    if count > 1 and ack_mode:
                        self._parts[run] = [1, 0]  # the walk hold
                    # A run of one event has no part entry: its open window and its
                    # outputs hold it, as they hold an event yielded alone.
                self._cursor = cursor + 1
                if index == count - 1:
                    self._seq += 1
                    run.undelivered -= 1
                    if run.undelivered == 0:
                        log.trim()
                break
            # ``_wait()``, inlined: a subscriber that keeps up waits once per event.
            waiters = group.waiters
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                waiters.discard(waiter)  # gone already unless this wait was cancelled
            if self._left:
                raise StopAsyncIteration
        if group.blocked:
            group.room.set()
        if ack_mode:
            self._current = run
            self._current_index = index
            self._current_resolved = False
            if _current_subscription.get() is not self:
                _current_subscription.set(self)
        return run.raws if count == 1 else run.raws[index]

    def holds(self, run: Run) -> bool:
        """Whether this subscriber has not resolved its part in ``run`` yet (it is in the
        run's snapshot and was not handed all of it, or holds it open). For statistics:
        O(1), changes nothing."""
        if self._joined_at > run.position or self._failure is not None or self._left:
            return False
        if self._cursor < run.position + run.count or run in self._parts:
            return True
        if run.count == 1:
            return (self._current is run and not self._current_resolved) or run in self._outputs
        return False

    def unresolved_events(self) -> int:
        """Events broadcast that this subscriber has not resolved: those not handed to
        it yet, and those handed in parts, outputs or the window still open (a part in
        a run of several counts every event handed of it). For statistics:
        O(parts + outputs), changes nothing."""
        if self._failure is not None or self._left:
            return 0
        cursor = self._cursor
        count = self._group.log.head - cursor
        parts = self._parts
        for run in parts:
            count += min(cursor, run.position + run.count) - run.position
        for ref in self._outputs:
            if isinstance(ref, Run) and ref not in parts:
                count += 1
        current = self._current
        if (
            current is not None
            and current.count == 1
            and not self._current_resolved
            and current not in self._outputs
            and current not in parts
        ):
            count += 1
        return count

    def _pass(self, run: Run) -> None:
        """Move the cursor past ``run`` without handing it out (it was skipped)."""
        self._cursor = run.position + run.count
        self._seq += 1
        run.undelivered -= 1
        group = self._group
        if run.undelivered == 0:
            group.log.trim()
        if group.blocked:
            group.room.set()

    async def _wait_queued(self) -> None:
        """Wait until an event is queued for this subscriber; raise what a pull raises.
        Cancellation: nothing changes."""
        group = self._group
        while True:
            if self._left:
                raise StopAsyncIteration
            if self._failure is not None:
                raise self._failure
            if group.terminal is not None:
                raise group.terminal_error()
            if self._cursor < group.log.head:
                return
            await self._wait()

    async def _wait(self) -> None:
        """Wait for the group's next broadcast (or a leave, a force-fail, the end of the
        group). Cancellation: nothing changes."""
        waiters = self._group.waiters
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            waiters.discard(waiter)  # gone already unless this wait was cancelled

    def _before_bulk_pull(self, max_events: int, what: str) -> None:
        group = self._group
        if not group.ack_mode:
            raise RuntimeError(f"{what}() needs an ack-mode subscription (producer=)")
        check_int("max_events", max_events, minimum=1)

    async def pull_bound(self, max_events: int) -> list[tuple[Any, int]]:
        """Pull up to ``max_events`` events at once, each with one output bound to it.

        The bulk form of ``raw = await anext(sub); seq = sub.bind()``, for a
        subscriber that batches or runs events concurrently: it waits, as a pull
        does, until an event is there, then hands out every event already queued for
        this subscriber, up to ``max_events``, in stream order, binding one output to
        each while its window is open. One await per call, not one per event.
        Returns ``(raw_event, seq)`` pairs; the window is left open on the last one.

        Each event then resolves exactly as if it had been pulled and bound alone:
        ``acked`` once its number is confirmed (the last one's window must close
        too), ``rejected`` / ``failed`` through ``reject_bound`` / ``fail_bound``,
        ``failed`` by the ack timeout if none of them comes. Leaving with an
        exception fails the last one only: fail the others' numbers yourself.

        Ack mode only (``RuntimeError`` otherwise); ``max_events`` must be an int
        >= 1 (``ValueError``). Raises what a pull raises. Cancellation while waiting
        hands out nothing and changes nothing.
        """
        self._before_bulk_pull(max_events, "pull_bound")
        raw = await self.__anext__()
        seq = self.bind()
        assert seq is not None, "an event just handed out is this subscriber's to bind"
        pulled = [(raw, seq)]
        if max_events == 1:
            return pulled
        group = self._group
        log = group.log
        outputs = self._outputs
        parts = self._parts
        bind = self._registry.bind
        while len(pulled) < max_events and self._cursor < log.head:
            run = log.entries[self._seq - log.base]
            index = self._cursor - run.position
            if index == 0 and run.skipped is not None and self._acked_earlier_copy(run):
                self._pass(run)
                continue
            current = self._current
            assert current is not None, "the open window is bound"
            self._close_window(current)  # unresolved until its output resolves
            self._cursor += 1
            if index == run.count - 1:
                self._seq += 1
                run.undelivered -= 1
            key: EventRef
            if run.count == 1:
                key = run  # no part entry: the output is its hold (``_output_confirmed``)
            else:
                key = (run, index)
                if index == 0:
                    parts[run] = [2, 0]  # the walk hold and the output
                else:
                    parts[run][0] += 1
            self._current = run
            self._current_index = index
            self._current_resolved = False
            outputs[key] = 1
            pulled.append((run.raws if run.count == 1 else run.raws[index], bind(self, key)))
        log.trim()
        if group.blocked:
            group.room.set()  # a poll waiting for room may wait for exactly this cursor
        return pulled

    async def pull_batch(self, max_events: int) -> BoundBatch:
        """Pull up to ``max_events`` events at once, all bound to one output.

        For a subscriber that handles events in batches: it waits, as a pull does,
        until an event is there, then hands out every event already queued for this
        subscriber, up to ``max_events``, in stream order. Their windows close at
        once, and one sequence number is bound to all of them: the returned
        :class:`BoundBatch` has the raw ``events`` and that ``seq``. Then:

        * ``manager.confirm_persisted([seq])``: every event of the batch is acked
          (and each resolves as if it had been pulled, bound and confirmed alone);
        * ``manager.reject_bound([seq], reason)`` / ``manager.fail_bound([seq])``:
          every event not resolved yet is rejected / failed;
        * ``manager.reject_in_batch(seq, indexes, reason)``: the events at those
          indexes of ``events`` are rejected now; the rest stay bound to ``seq``;
        * none of these within ``ack_timeout`` of an event's broadcast: the
          subscriber is force-failed, as for any unconfirmed output.

        Leaving does not resolve a batch (its windows are closed): resolve it
        first, with ``fail_bound`` if the handler crashed. Costs one step per run
        of events broadcast together, not one per event: this is the bulk path of
        batching consumers.

        Ack mode only (``RuntimeError`` otherwise); ``max_events`` must be an int
        >= 1 (``ValueError``). Raises what a pull raises. Cancellation while waiting
        hands out nothing and changes nothing.
        """
        self._before_bulk_pull(max_events, "pull_batch")
        group = self._group
        if self._left:
            raise StopAsyncIteration
        unresolved = group.unresolved
        if unresolved and group.clock() - unresolved[0].broadcast_at >= group.ack_timeout:
            group.expire()
        current = self._current
        if current is not None:
            self._close_window(current)
        while True:
            await self._wait_queued()
            slices = self._take_slices(max_events)
            if slices:
                break
        binding = BatchBinding(slices)
        self._batches[binding] = None
        if len(slices) == 1:
            # A copy even of a whole run: every subscriber gets its own list.
            run, start, stop = slices[0]
            events = run.raw_events(start, stop)
        else:
            events = [raw for run, start, stop in slices for raw in run.raw_events(start, stop)]
        return BoundBatch(events, self._registry.bind(self, binding))

    def _take_slices(self, limit: int) -> list[tuple[Run, int, int]]:
        """Up to ``limit`` queued events, as slices of runs, in stream order, each run
        held by the binding about to be made; the cursor moves past them and past the
        runs it passes (counted acked: it acked an earlier copy)."""
        group = self._group
        log = group.log
        parts = self._parts
        taken: list[tuple[Run, int, int]] = []
        while limit > 0 and self._cursor < log.head:
            run = log.entries[self._seq - log.base]
            start = self._cursor - run.position
            if start == 0 and run.skipped is not None and self._acked_earlier_copy(run):
                self._pass(run)
                continue
            stop = min(run.count, start + limit)
            limit -= stop - start
            self._cursor += stop - start
            taken.append((run, start, stop))
            if start == 0:
                parts[run] = [1, 0]  # the binding's hold
                if stop < run.count:
                    parts[run][0] = 2  # and the walk's, until the rest is taken
            else:
                parts[run][0] += 1
            if stop == run.count:
                self._seq += 1
                run.undelivered -= 1
                if start != 0:
                    group.release(self, run)  # the walk is over
        log.trim()
        if group.blocked:
            group.room.set()  # a poll waiting for room may wait for exactly this cursor
        return taken

    async def wait_failed(self) -> Exception:
        """Wait until a pull would raise instead of handing out an event, and return
        that exception (without raising it): the subscription was force-failed
        (``AckTimeout``, ``SubscriberOverflow``) or its group ended
        (``StreamTerminated``, ``AdvanceFailed``). Returns at once if so already.

        For a subscriber that holds events without pulling (one that runs calls
        concurrently or batches): it learns of a force-fail or of the end of the
        group at once, not at its next pull. ``RuntimeError`` once the
        subscription was left (also when it is left while waiting).

        Cancellation: nothing changes.
        """
        group = self._group
        while True:
            if self._left:
                raise RuntimeError(f"{self!r} was left")
            if self._failure is not None:
                return self._failure
            if group.terminal is not None:
                return group.terminal_error()
            if self._unusable is None:
                self._unusable = asyncio.Event()
            await self._unusable.wait()

    def _acked_earlier_copy(self, run: Run) -> bool:
        """Whether this subscriber, in the snapshot of ``run`` (a redelivered copy)
        and not handed any of it, acked an earlier copy of every one of its events
        (docs/concepts.md#redelivery-memory): then it is not handed ``run``.

        Caller: every hand-out (``__anext__``, ``pull_bound``, ``_take_slices``) and
        what resolves the runs still queued for it (leaving, a force-fail, the end of
        the group, the ack timeout). An ack made before the broadcast was counted
        then (``Group._carry_over``); one made since is counted at the first call, the
        same way: ``acked``, and its events' redeliveries skipped. Its bit in
        ``run.skipped`` makes later calls count nothing.
        """
        bit = self._bit
        if bit is None:
            return False
        flag = 1 << bit
        skipped = run.skipped
        assert skipped is not None, "caller: a redelivered copy"
        if skipped & flag:
            return True
        memory = run.memory
        assert memory is not None, "a redelivered copy has its ids' record"
        if not memory.acked_by(flag) and not self._acked_in_open_part(memory.in_range):
            return False
        self._group.skip_at_hand_out(run, self, flag)
        return True

    def _acked_in_open_part(self, where: tuple[tuple[Hashable, ...], int] | None) -> bool:
        """Whether this subscriber acked the event with id ``(*prefix, offset)``
        (``where``) of a run it is still busy with: a range of ids remembers a
        subscriber's acks only once its whole part in the run is done, so the run's
        state is asked. Acked: handed, window closed, not rejected or failed, and no
        output or batch still owing it."""
        if where is None or not self._parts:
            return False
        prefix, offset = where
        for run, part in self._parts.items():
            memory = run.memory
            if not isinstance(memory, _Spanned):
                continue
            span = memory.span
            if span.prefix != prefix or not span.first <= offset < span.stop:
                continue
            index = offset - span.first
            if part[1] >> index & 1:
                return False  # rejected or failed by this subscriber
            handed = min(self._cursor - run.position, run.count)
            if index >= handed or (run is self._current and index == self._current_index):
                return False
            if (run, index) in self._outputs:
                return False
            return not any(batch.owes_event(run, index) for batch in self._batches)
        return False

    @property
    def redeliveries_skipped(self) -> int:
        """Redelivered copies this subscriber id was not handed: it had acked them."""
        return self._group.redeliveries_skipped_by.get(self.subscriber_id, 0)

    def _close_window(self, run: Run) -> None:
        """The window on the open event closes: acked, unless an output bound to it is
        unconfirmed (the last confirmation acks it) or it was resolved otherwise. On
        the run's last event, the walk through the run is over."""
        self._current = None
        if self._current_resolved:
            return  # its part ended then (``_resolved_in_window``)
        if run.count == 1:
            if run not in self._outputs:
                self._group.part_done(self, run, 0)
            return  # else the last confirmation acks it (``_output_confirmed``)
        index = self._current_index
        if run.memory is not None and self._bit is not None and (run, index) not in self._outputs:
            run.memory.ack_some((index,), 1 << self._bit)  # acked, perhaps before the rest
        if self._cursor >= run.position + run.count:
            # Nothing more of the run is handed out (its last event was, or the rest
            # was resolved without a hand-out): the walk is over.
            self._group.release(self, run)

    def _resolved_in_window(self, run: Run) -> None:
        """The open event was rejected or failed (marked, its outputs dropped by the
        caller): a run of one event is done for this subscriber; on the last event of
        a longer run, the walk through it is over (closing the window adds nothing)."""
        self._current_resolved = True
        if run.count == 1:
            self._group.part_done(self, run, 1)
        elif self._cursor >= run.position + run.count:
            self._group.release(self, run)  # nothing more of it is handed out

    def _output_resolved(
        self, target: EventRef | BatchBinding, how: Resolution, reason: str | None
    ) -> int | None:
        """Caller: the output registry (``reject_bound`` / ``fail_bound``). Resolves
        this subscriber's part in ``target`` (an event, or every event of a batch
        binding not resolved yet) as ``how`` at once, open window or not, left or
        not. Returns how many other numbers bound to it went stale, or ``None`` if
        it was no longer this subscriber's to resolve."""
        if isinstance(target, BatchBinding):
            if target not in self._batches:
                return None
            del self._batches[target]
            self._group.resolve_binding(self, target, how, self._reason(reason))
            self._discard_if_departed()
            return 0
        count = self._outputs.pop(target, None)
        if count is None:
            return None
        run, index = target if isinstance(target, tuple) else (target, 0)
        group = self._group
        group.mark(self, run, index, how, self._reason(reason))
        if run is self._current and index == self._current_index:
            self._resolved_in_window(run)
        elif run.count == 1:
            group.part_done(self, run, 1)  # its window closed before
        if run.count > 1:
            group.release(self, run, count)
        self._discard_if_departed()
        return count - 1

    def _batch_part_rejected(
        self, batch: BatchBinding, indexes: list[object], reason: str | None
    ) -> bool | None:
        """Caller: the output registry (``reject_in_batch``). Rejects the events at
        ``indexes`` of ``batch`` alone. Returns whether the binding has nothing
        left to resolve, or ``None`` if it was no longer live."""
        if batch not in self._batches:
            return None
        group = self._group
        text = self._reason(reason)
        for index in indexes:
            if type(index) is not int or not 0 <= index < batch.size:
                logger.warning(
                    "reject_in_batch() ignored index %r: not an index of the batch "
                    "(%d events) key=%r subscriber_id=%r",
                    index,
                    batch.size,
                    self.key,
                    self.subscriber_id,
                )
                continue
            if batch.apart is None or index not in batch.apart:
                run, run_index, slice_apart = batch.set_apart(index)
                group.mark(self, run, run_index, "rejected", text)
                if slice_apart:
                    group.release(self, run)  # nothing of it is left in the binding
        if batch.apart is None or len(batch.apart) < batch.size:
            return False
        del self._batches[batch]
        self._discard_if_departed()
        return True

    def _discard_if_departed(self) -> None:
        """A departed subscription leaves the group's care once it owes nothing."""
        if self._left and not self._outputs and not self._batches:
            self._group.departed.discard(self)

    def _reason(self, reason: str | None) -> str | None:
        return None if reason is None else f"{self.subscriber_id}: {reason}"

    def _output_confirmed(self, target: EventRef | BatchBinding) -> bool:
        """Caller: the output registry. Returns False if the number was stale."""
        outputs = self._outputs
        if isinstance(target, Run):
            # An output on a run of one event, the per-event path's: kept flat.
            count = outputs.get(target)
            if count is None:
                return False
            if count > 1:
                outputs[target] = count - 1
            else:
                del outputs[target]
                if target is not self._current:  # acked once its window is closed too
                    if target.memory is None and target.pending > 1:
                        target.pending -= 1  # ``Group.part_done``, inlined: others owe it
                    else:
                        self._group.part_done(self, target, 0)
                    if self._left:
                        self._discard_if_departed()
            return True
        if isinstance(target, BatchBinding):
            if target not in self._batches:
                return False
            del self._batches[target]
            release = self._group.release
            bit = self._bit
            for run, start, stop, indexes in target.remaining():
                if indexes == []:
                    continue  # resolved alone already: the binding let go of the run
                if run.memory is not None and bit is not None and run.count > stop - start:
                    # Acked before the rest of the run.
                    run.memory.ack_some(
                        range(start, stop) if indexes is None else indexes, 1 << bit
                    )
                release(self, run)
            self._discard_if_departed()
            return True
        count = outputs.get(target)
        if count is None:
            return False
        run, index = target
        if count > 1:
            outputs[target] = count - 1
            self._group.release(self, run)  # each output holds the part
            return True
        del outputs[target]
        if (
            run.memory is not None
            and self._bit is not None
            and not (run is self._current and index == self._current_index)
        ):
            run.memory.ack_some((index,), 1 << self._bit)  # before the rest of the run
        self._group.release(self, run)
        if self._left:
            self._discard_if_departed()
        return True

    # -- binding and rejecting ---------------------------------------------------

    def bind(self) -> int | None:
        """Bind one derived output to the open window; return its sequence number.

        Pass the number to ``manager.confirm_persisted`` once the output is stored, or to
        ``manager.reject_bound`` / ``manager.fail_bound`` to resolve the event otherwise, possibly
        after moving on (docs/concepts.md#deferred-resolution). Returns ``None`` outside ack mode,
        outside a window, when this subscriber's part in the open event is already resolved, or once
        the group stopped.
        """
        run = self._current
        if run is None or self._current_resolved:
            return None
        outputs = self._outputs
        key: EventRef
        if run.count == 1:
            key = run  # no part entry: its outputs and window hold it
        else:
            key = (run, self._current_index)
            self._parts[run][0] += 1
        outputs[key] = outputs.get(key, 0) + 1
        return self._registry.bind(self, key)

    def reject(self, reason: str | None = None) -> None:
        """Resolve the open event as ``rejected`` now; nothing bound to it counts any more.

        ``reason`` (a ``str``, else ``TypeError``) reaches the producer as
        ``"<subscriber_id>: <reason>"`` in the event's ``AdvanceOutcome.reasons``.
        Outside an ack-mode window: a warning, nothing else. On an event already
        resolved for this subscriber: nothing.
        """
        _check_reason(reason)
        run = self._current
        if run is None or self._left:
            logger.warning(
                "reject() outside an ack-mode window key=%r subscriber_id=%r",
                self.key,
                self.subscriber_id,
            )
            return
        if self._current_resolved:
            return
        self._resolve_open(run, "rejected", self._reason(reason))

    def _resolve_open(self, run: Run, how: Resolution, reason: str | None) -> None:
        """Reject or fail the open event now (``reject``, a crash, a force-fail): the
        outputs bound to it no longer count. ``reason`` is already prefixed."""
        index = self._current_index
        count = self._outputs.pop(run if run.count == 1 else (run, index), 0)
        self._registry.abandoned(count)
        group = self._group
        group.mark(self, run, index, how, reason)
        self._resolved_in_window(run)
        if count and run.count > 1:
            group.release(self, run, count)

    # -- leaving -----------------------------------------------------------------

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave: an exception (cancellation included) fails the open event, a clean
        exit acks it. Cancelled while waiting for the group to stop, the stop goes on."""
        await self._leave(crashed=exc_type is not None)

    async def aclose(self) -> None:
        """Leave cleanly: done with the current event; queued events fail.

        If this was the group's last subscriber, returns after the group stopped
        (final advances done, producer closed). Cancellation while waiting for
        that does not interrupt the group's shutdown. Idempotent.
        """
        await self._leave(crashed=False)

    async def _leave(self, *, crashed: bool) -> None:
        stop = self._group.leave(self, crashed=crashed)
        if stop is not None:
            await asyncio.shield(stop)
