"""One subscriber's view of a group: an async iterator of raw events with a window.

The subscription owns its per-subscriber state: its cursor into the group's
fan-out log, the event it is on (its open window) and the bindings of outputs it
derived. State shared by every subscriber (the log, the lanes, the resolution
counts) belongs to the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from contextvars import ContextVar
from itertools import islice
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ackgate._bindings import BatchBinding, BoundBatch

if TYPE_CHECKING:
    from ackgate._group import Group, Resolution
    from ackgate._log import Event

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


class Subscription:
    """A subscriber's membership in a group; iterate it to receive raw events.

    Each ``async for`` step closes the window on the previous event and opens one
    on the next. Leave with ``async with`` so a crash is seen: exiting with an
    exception (cancellation included) fails the event you are on, exiting cleanly
    (or :meth:`aclose`) means you are done with it.
    """

    def __init__(self, group: Group, subscriber_id: Hashable, position: int) -> None:
        self._group = group
        self._registry = group.bindings
        self.key: Hashable = group.key
        self.subscriber_id = subscriber_id
        #: First stream position whose snapshot includes this subscriber.
        self._joined_at = position
        #: Next stream position to hand out. Invariant: ``_joined_at <= _cursor <= log.head``.
        self._cursor = position
        #: The event whose window is open, if any.
        self._current: Event | None = None
        #: Whether this subscriber's part in ``_current`` is already resolved.
        self._current_resolved = False
        #: Unconfirmed outputs per event whose part is not resolved yet, the open
        #: window's included. Invariant: never holds an event this subscriber resolved.
        self._outputs: dict[Event, int] = {}
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
        # flat on purpose (the log lookup is inlined).
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
                self._close_window(current)
        log = group.log
        while True:
            if self._failure is not None:
                raise self._failure
            if group.terminal is not None:
                raise group.terminal_error()
            cursor = self._cursor
            if cursor < log.head:
                event = log.entries[cursor - log.base]
                self._cursor = cursor + 1
                event.undelivered -= 1
                if event.undelivered == 0:
                    log.trim()
                if not (event.redelivered and self._acked_earlier_copy(event)):
                    break
                # Counted acked (it acked an earlier copy): pass it. A poll waiting
                # for room may be waiting for exactly this cursor.
                if group.blocked:
                    group.room.set()
                continue
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            waiters = group.waiters
            waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                waiters.discard(waiter)  # gone already unless this pull was cancelled
            if self._left:
                raise StopAsyncIteration
        if group.blocked:
            group.room.set()
        if ack_mode:
            self._current = event
            self._current_resolved = False
            if _current_subscription.get() is not self:
                _current_subscription.set(self)
        return event.raw

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
        group = self._group
        if not group.ack_mode:
            raise RuntimeError("pull_bound() needs an ack-mode subscription (producer=)")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be an int >= 1, got {max_events!r}")
        raw = await self.__anext__()
        seq = self.bind()
        assert seq is not None, "an event just handed out is this subscriber's to bind"
        pulled = [(raw, seq)]
        outputs = self._outputs
        bind = self._registry.bind
        for event in self._take_queued(max_events - 1):
            current = self._current
            assert current is not None and current in outputs, "the open window is bound"
            self._close_window(current)  # unresolved until its output resolves
            self._current = event
            self._current_resolved = False
            outputs[event] = 1
            pulled.append((event.raw, bind(self, event)))
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
        first, with ``fail_bound`` if the handler crashed. Costs one loop step per
        event, not one call: this is the bulk path of batching consumers.

        Ack mode only (``RuntimeError`` otherwise); ``max_events`` must be an int
        >= 1 (``ValueError``). Raises what a pull raises. Cancellation while waiting
        hands out nothing and changes nothing.
        """
        group = self._group
        if not group.ack_mode:
            raise RuntimeError("pull_batch() needs an ack-mode subscription (producer=)")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be an int >= 1, got {max_events!r}")
        await self.__anext__()
        first = self._current
        assert first is not None and not self._current_resolved, "a pull opens a window"
        self._current = None  # closed at once: the batch binding holds the event
        events = [first, *self._take_queued(max_events - 1)]
        binding = BatchBinding(events)
        self._batches[binding] = None
        return BoundBatch([event.raw for event in events], self._registry.bind(self, binding))

    def _take_queued(self, limit: int) -> list[Event]:
        """Up to ``limit`` events already queued for this subscriber, in stream order,
        for a bulk hand-out; the cursor moves past them and past the copies it passes
        (counted acked: it acked an earlier copy). Mirrors the hand-out of
        ``__anext__`` (kept inline there: the hot path), one loop step per event."""
        group = self._group
        log = group.log
        taken: list[Event] = []
        if limit <= 0 or self._cursor == log.head:
            return taken
        passed = 0
        for event in islice(log.entries, self._cursor - log.base, None):
            if len(taken) == limit:
                break
            passed += 1
            event.undelivered -= 1
            if event.redelivered and self._acked_earlier_copy(event):
                continue
            taken.append(event)
        self._cursor += passed
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

    def _acked_earlier_copy(self, event: Event) -> bool:
        """Whether this subscriber, in the snapshot of ``event`` (a redelivered copy),
        acked an earlier copy of it (SPEC §13): then it is not handed ``event``.

        Caller: every hand-out (``__anext__``, ``_take_queued``) and what resolves the
        events still queued for it (leaving, a force-fail, the end of the group, the
        ack timeout). An ack made before the broadcast was counted then
        (``Group._carry_over``); one made since is counted at the first call, the same
        way: ``acked``, and one more redelivery skipped. Its bit in ``event.skipped``
        makes later calls count nothing.
        """
        bit = self._bit
        if bit is None:
            return False
        cell = event.acked_cell
        assert cell is not None, "a redelivered copy has its id's cell"
        flag = 1 << bit
        if not cell[0] & flag:
            return False
        if not event.skipped & flag:
            self._group.skip_at_hand_out(event, self, flag)
        return True

    @property
    def redeliveries_skipped(self) -> int:
        """Redelivered copies this subscriber id was not handed: it had acked them."""
        return self._group.redeliveries_skipped_by.get(self.subscriber_id, 0)

    def _close_window(self, event: Event) -> None:
        self._current = None
        if not self._current_resolved and event not in self._outputs:
            self._group.resolve_acked(event, self)
        # Otherwise the last confirmation resolves it (``_output_confirmed``).

    def _output_resolved(
        self, target: Event | BatchBinding, how: Resolution, reason: str | None
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
            for owed in target.remaining():
                self._resolve(owed, how, reason)
            self._discard_if_departed()
            return 0
        event = target
        count = self._outputs.pop(event, None)
        if count is None:
            return None
        if event is self._current:
            self._current_resolved = True
        self._resolve(event, how, reason)
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
        events = batch.events
        apart = batch.apart
        if apart is None:
            apart = batch.apart = set()
        for index in indexes:
            if type(index) is not int or not 0 <= index < len(events):
                logger.warning(
                    "reject_in_batch() ignored index %r: not an index of the batch "
                    "(%d events) key=%r subscriber_id=%r",
                    index,
                    len(events),
                    self.key,
                    self.subscriber_id,
                )
                continue
            event = events[index]
            if event not in apart:
                apart.add(event)
                self._resolve(event, "rejected", reason)
        if len(apart) < len(events):
            return False
        del self._batches[batch]
        self._discard_if_departed()
        return True

    def _discard_if_departed(self) -> None:
        """A departed subscription leaves the group's care once it owes nothing."""
        if self._left and not self._outputs and not self._batches:
            self._group.departed.discard(self)

    def _resolve(self, event: Event, how: Resolution, reason: str | None) -> None:
        if reason is not None:
            reason = f"{self.subscriber_id}: {reason}"
        self._group.resolve(event, how, reason, self._order)

    def _output_confirmed(self, target: Event | BatchBinding) -> bool:
        """Caller: the output registry. Returns False if the number was stale."""
        if isinstance(target, BatchBinding):
            if target not in self._batches:
                return False
            del self._batches[target]
            self._group.resolve_acked_all(target.remaining(), self)
            self._discard_if_departed()
            return True
        event = target
        outputs = self._outputs
        count = outputs.get(event)
        if count is None:
            return False
        if count > 1:
            outputs[event] = count - 1
            return True
        del outputs[event]
        if event is not self._current:  # its window is closed: this was the last output
            self._group.resolve_acked(event, self)
            self._discard_if_departed()
        return True

    # -- binding and rejecting ---------------------------------------------------

    def bind(self) -> int | None:
        """Bind one derived output to the open window; return its sequence number.

        Pass the number to ``manager.confirm_persisted`` once the output is stored,
        or to ``manager.reject_bound`` / ``manager.fail_bound`` to resolve the
        event otherwise, possibly after moving on (SPEC §8). Returns ``None``
        outside ack mode, outside a window, when this subscriber's part in the
        open event is already resolved, or once the group stopped.
        """
        event = self._current
        if event is None or self._current_resolved:
            return None
        outputs = self._outputs
        outputs[event] = outputs.get(event, 0) + 1
        return self._registry.bind(self, event)

    def reject(self, reason: str | None = None) -> None:
        """Resolve the open event as ``rejected`` now; nothing bound to it counts any more.

        ``reason`` (a ``str``, else ``TypeError``) reaches the producer as
        ``"<subscriber_id>: <reason>"`` in the event's ``AdvanceOutcome.reasons``.
        Outside an ack-mode window: a warning, nothing else. On an event already
        resolved for this subscriber: nothing.
        """
        _check_reason(reason)
        event = self._current
        if event is None or self._left:
            logger.warning(
                "reject() outside an ack-mode window key=%r subscriber_id=%r",
                self.key,
                self.subscriber_id,
            )
            return
        if self._current_resolved:
            return
        self._current_resolved = True
        self._registry.abandoned(self._outputs.pop(event, 0))
        self._resolve(event, "rejected", reason)

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
