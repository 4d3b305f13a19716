"""A group: one upstream poll shared by every subscriber of one key.

Topology: the poll task reads the producer (or source) and appends each run of
events (a fetched batch, or one event) to the fan-out log (:mod:`ackgate._log`);
subscriptions read the log through their cursors (:mod:`ackgate._subscription`);
resolutions are counted on the run, per event only where a subscriber treated one
differently, and the lane tracker advances resolved prefixes (:mod:`ackgate._tracker`).

Lifecycle: *running* until the first of: the upstream ends or misbehaves, an
advance raises, the last subscriber leaves, the manager closes. Then
:meth:`Group.terminate` runs once: the key is released at once, subscribers
still iterating get ``terminal_error()``, and a stop task cancels polling,
advances what is already resolved, and closes the producer exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ackgate._bindings import BatchBinding, OutputRegistry
from ackgate._errors import (
    AckTimeout,
    AdvanceFailed,
    StreamTerminated,
    SubscriberOverflow,
)
from ackgate._log import EventLog, Lane, Resolution, Run
from ackgate._outcome import EventBatch
from ackgate._producer import SharedStreamProducer
from ackgate._redelivery import RedeliveryMemory
from ackgate._tracker import LaneTracker
from ackgate._upstream import Upstream

if TYPE_CHECKING:
    from ackgate._subscription import Subscription

logger = logging.getLogger("ackgate.group")

#: Seconds a rostered group may stay paused after a clean leave before a WARNING.
_CLEAN_LEAVE_GRACE = 1.0

#: How many event ids a group remembers to skip redelivered copies (SPEC §13).
_REMEMBERED_EVENT_IDS = 65_536


@dataclass(frozen=True, slots=True)
class GroupConfig:
    ack_timeout: float
    subscriber_queue_size: int
    cohort_grace_period: float
    max_concurrent_advances: int
    overflow: Literal["fail", "block"]
    clock: Callable[[], float]
    max_outstanding: int


class Group:
    def __init__(
        self,
        key: Hashable,
        factory: Callable[[], Any],
        *,
        ack_mode: bool,
        config: GroupConfig,
        bindings: OutputRegistry,
        release: Callable[[Group], None],
        roster: tuple[Hashable, ...] | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        self.key = key
        #: The broker connection as the producer reports it; an earlier group's of
        #: the same key if that one ended while its upstream was down.
        self.upstream = Upstream(key) if upstream is None else upstream
        #: The declared subscriber ids (§7), in the order first given; ``None``: dynamic.
        self.roster = roster
        self.ack_mode = ack_mode
        self.bindings = bindings
        self.log = EventLog()
        self.tracker = LaneTracker(
            config.max_concurrent_advances, self._advance_failed, config.max_outstanding
        )
        #: Live subscriptions by id, force-failed ones included, until they leave.
        self.members: dict[Hashable, Subscription] = {}
        #: Members not force-failed: the next event's snapshot.
        self.active: set[Subscription] = set()
        #: Subscriptions that left while outputs they bound were still unconfirmed.
        self.departed: set[Subscription] = set()
        #: Futures of subscriptions waiting for the next event. Invariant: at most one
        #: per subscription (a pull removes its own, however it ends), so cancelled
        #: pulls on an idle stream do not pile up.
        self.waiters: set[asyncio.Future[None]] = set()
        #: Subscriptions created so far: the next one's subscription order (SPEC §8).
        self.joins = 0
        self.blocked = False  # the poll waits for room (overflow="block", rostered groups)
        self.room = asyncio.Event()
        #: Rostered groups: set while every roster member is attached and not
        #: force-failed. Invariant: the poll broadcasts only while it is set, so every
        #: event's snapshot is the whole roster.
        self._healthy = asyncio.Event()
        self._ever_healthy = False
        #: A pause after a clean leave, logged only if it lasts (``_check_health``).
        self._pause_warning: asyncio.Task[None] | None = None
        self.terminal: tuple[type[StreamTerminated], str, BaseException | None] | None = None
        self._config = config
        self._factory = factory
        self._release = release
        self.clock = config.clock
        self.ack_timeout = config.ack_timeout
        self._queue_size = config.subscriber_queue_size
        #: A lower bound of the smallest cursor among active subscribers.
        self._min_cursor_hint = 0
        #: Ack mode: broadcast events not yet resolved, in broadcast order. Invariant:
        #: its first event, if any, is unresolved (pruned as events resolve).
        #: Later ones may be resolved already; they go when they reach the front.
        self.unresolved: deque[Run] = deque()
        self._timer_wakeup: asyncio.Future[None] | None = None
        #: The clock's own way to wait for a deadline (``FakeClock.sleep_until``), if any.
        self._sleep_until: Callable[[float], Awaitable[None]] | None = getattr(
            config.clock, "sleep_until", None
        )
        self._producer: SharedStreamProducer | None = None
        #: Who acked which event ids, to skip them on a redelivered copy (SPEC §13).
        self.redelivery = RedeliveryMemory(_REMEMBERED_EVENT_IDS)
        self.redeliveries_skipped = 0
        self.redeliveries_skipped_by: dict[Hashable, int] = {}
        #: Set once the poll no longer reads the upstream (it ended, or is closing the
        #: stream): from then on the stop must not cancel it, so the stream's
        #: ``finally`` runs to its end.
        self._poll_exited = False
        self.stop_task: asyncio.Task[None] | None = None
        self._get_event_id: Callable[[Any], Hashable] | None = None
        loop = asyncio.get_running_loop()
        self._poll_task = loop.create_task(self._poll())
        self._timer_task = loop.create_task(self._watch_timeouts()) if ack_mode else None
        logger.info("Shared stream group started key=%r", key)

    # -- membership ----------------------------------------------------------------

    def join(self, subscription: Subscription) -> None:
        subscription._bit = self.redelivery.bit(subscription.subscriber_id)
        subscription._order = self.joins
        self.joins += 1
        self.members[subscription.subscriber_id] = subscription
        self.active.add(subscription)
        self._check_health()

    @property
    def paused(self) -> bool:
        """A rostered group that broadcasts nothing new: a member is not healthy."""
        return self.roster is not None and not self._healthy.is_set()

    def missing(self) -> tuple[Hashable, ...]:
        """Roster members that are not attached or force-failed, in roster order."""
        if self.roster is None:
            return ()
        healthy = {sub.subscriber_id for sub in self.active}
        return tuple(member for member in self.roster if member not in healthy)

    def _check_health(self, *, left_cleanly: bool = False) -> None:
        """Pause or resume a rostered group after its membership changed.

        A pause is logged at WARNING at once when a member crashed or was
        force-failed. When a member left cleanly the warning waits
        ``_CLEAN_LEAVE_GRACE`` seconds and is dropped if the group resumed or
        stopped meanwhile: a service shutting down leaves member by member, and
        that is no incident.
        """
        if self.roster is None:
            return
        healthy = len(self.active) == len(self.roster)  # active ids ⊆ roster
        if healthy == self._healthy.is_set():
            return
        if healthy:
            self._healthy.set()
            if self._ever_healthy:
                logger.info("Shared stream group resumed key=%r", self.key)
            self._ever_healthy = True
            return
        self._healthy.clear()
        if not self.members or self.terminal is not None:
            return
        if not left_cleanly:
            self._warn_paused()
        elif self._pause_warning is None or self._pause_warning.done():
            self._pause_warning = asyncio.get_running_loop().create_task(
                self._warn_if_still_paused()
            )

    def _warn_paused(self) -> None:
        logger.warning(
            "Shared stream group paused key=%r missing=%r: nothing new is broadcast "
            "until every roster member is subscribed and healthy again",
            self.key,
            list(self.missing()),
        )

    async def _warn_if_still_paused(self) -> None:
        deadline = self.clock() + _CLEAN_LEAVE_GRACE
        if self._sleep_until is not None:
            await self._sleep_until(deadline)
        else:
            await asyncio.sleep(_CLEAN_LEAVE_GRACE)
        if self.paused and self.members and self.terminal is None:
            self._warn_paused()

    def leave(self, sub: Subscription, *, crashed: bool) -> asyncio.Task[None] | None:
        """Remove ``sub``; return the stop task to await if it was the last member."""
        if sub._left:
            return self.stop_task if not self.members else None
        sub._left = True
        del self.members[sub.subscriber_id]
        self.active.discard(sub)
        if sub._failure is None and self.ack_mode:
            run = sub._current
            if run is not None:
                if crashed:
                    self._fail_current(sub, run)
                else:
                    sub._close_window(run)
            sub._current = None
        if sub._failure is None:
            self._skip_queued(sub)  # a force-failed subscriber skipped them already
        if sub._outputs or sub._batches:
            self.departed.add(sub)
        self._wake(sub)
        if self.blocked:
            self.room.set()
        self._check_health(left_cleanly=not crashed and sub._failure is None)
        if not self.members:
            self.terminate(StreamTerminated, "last subscriber left")
            return self.stop_task
        return None

    def _fail_current(self, sub: Subscription, run: Run) -> None:
        """``sub`` crashed (or was force-failed) on its open event: it fails, with
        whatever was bound to it; on the run's last event, the walk is over too."""
        if not sub._current_resolved:
            sub._resolve_open(run, "failed", None)
        sub._current = None

    def _skip_queued(self, sub: Subscription) -> None:
        """``sub`` will never be handed its queued events: they resolve as failed,
        except the runs of ids it acked (counted acked, as a hand-out would)."""
        log = self.log
        ack_mode = self.ack_mode
        if sub._cursor < log.head:
            run = log.at(sub._seq)
            start = sub._cursor - run.position
            if start:  # the rest of a run it is walking through (of several events)
                if ack_mode:
                    for index in range(start, run.count):
                        self.mark(sub, run, index, "failed", None)
                    if sub._current is not run or sub._current_resolved:
                        self.release(sub, run)  # the walk is over
                    # Else its window is open on an event of the run: closing it ends
                    # the walk (``Subscription._close_window``).
                run.undelivered -= 1
                sub._seq += 1
            for seq in range(sub._seq, log.next_seq):
                run = log.at(seq)
                run.undelivered -= 1
                if ack_mode and not (run.skipped is not None and sub._acked_earlier_copy(run)):
                    self._fail_unhanded(sub, run)
        sub._cursor = log.head
        sub._seq = log.next_seq
        log.trim()

    def _wake(self, sub: Subscription) -> None:
        """``sub`` left or was force-failed: a pull, and ``wait_failed``, must see it."""
        waiter = sub._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if sub._unusable is not None:
            sub._unusable.set()

    # -- resolution ----------------------------------------------------------------
    #
    # A subscriber resolves its part in a run: all of the run's events. Acks are the
    # default (nothing is recorded per event); a reject or a failure of one event is
    # a mark on the run (``mark``), of every event of a run it was never handed a
    # count on the run (``_fail_unhanded``). The part is resolved once nothing
    # holds it any more (``release``); the run, once every part is.

    def release(self, sub: Subscription, run: Run, holds: int = 1) -> None:
        """``holds`` of ``sub``'s holds on its part in ``run`` ended (module
        ``ackgate._subscription``): the part is resolved once none is left."""
        part = sub._parts.get(run)
        if part is None:
            assert self.terminal is not None, "a part is released only while open"
            return  # the group stopped: its parts were abandoned
        left = part[0] - holds
        if left:
            assert left > 0, "released more holds than were taken"
            part[0] = left
            return
        del sub._parts[run]
        self.part_done(sub, run, part[1])

    def part_done(self, sub: Subscription, run: Run, marked: int) -> None:
        """``sub`` resolved its part in ``run``: acked every event but those whose bits
        are set in ``marked`` (rejected or failed)."""
        memory = run.memory
        if memory is not None and sub._bit is not None:
            if not marked:
                memory.ack(1 << sub._bit)  # acked every event of the run: remembered
            elif run.count > 1 and marked != (1 << run.count) - 1:
                memory.ack_except(marked, 1 << sub._bit)
        pending = run.pending - 1
        assert pending >= 0, "resolved more often than its snapshot allows"
        run.pending = pending
        if not pending:
            self._resolved(run)

    def mark(
        self, sub: Subscription, run: Run, index: int, how: Resolution, reason: str | None
    ) -> None:
        """``sub`` failed or rejected the event at ``index`` of ``run`` alone (its part
        stays open until released). A reject ``reason`` (``"<id>: <reason>"``) is kept
        for the outcome, ordered by the subscription order."""
        part = sub._parts.get(run)
        if part is not None:
            part[1] |= 1 << index
        if run.count == 1:  # the whole run: counted on it
            if how == "failed":
                run.failed += 1
            else:
                run.rejected += 1
                if reason is not None:
                    self._keep_reason(run, None, sub, reason)
            return
        marks = self.tracker.marks.setdefault(run, {})
        counts = marks.get(index)
        if counts is None:
            counts = marks[index] = [0, 0]
        counts[0 if how == "failed" else 1] += 1
        if reason is not None and how == "rejected":
            self._keep_reason(run, index, sub, reason)

    def _keep_reason(self, run: Run, index: int | None, sub: Subscription, reason: str) -> None:
        self.tracker.reasons.setdefault(run, {}).setdefault(index, []).append((sub._order, reason))

    def _fail_unhanded(self, sub: Subscription, run: Run) -> None:
        """``sub`` fails every event of ``run``, which it was never handed."""
        run.failed += 1
        self.part_done(sub, run, (1 << run.count) - 1)

    def resolve_binding(
        self, sub: Subscription, binding: BatchBinding, how: Resolution, reason: str | None
    ) -> None:
        """``sub`` resolves what ``binding`` still resolves as ``how``, and the binding
        lets go of its runs. A slice that is a whole run counts once on the run."""
        for run, start, stop, indexes in binding.remaining():
            if indexes is None and start == 0 and stop == run.count:
                # Every event of the run is in this binding: one count for the part.
                sub._parts[run][1] = (1 << run.count) - 1
                if how == "failed":
                    run.failed += 1
                else:
                    run.rejected += 1
                    if reason is not None:
                        self._keep_reason(run, None, sub, reason)
                self.release(sub, run)
                continue
            if indexes == []:
                continue  # resolved alone already: the binding let go of the run then
            for index in range(start, stop) if indexes is None else indexes:
                self.mark(sub, run, index, how, reason)
            self.release(sub, run)

    def _resolved(self, run: Run) -> None:
        """``run`` is resolved by its whole snapshot: advance it, stop timing it.

        Pruning ``unresolved`` here, not only when a timeout is checked, keeps
        resolved runs (and their raw payloads) from being held for up to
        ``ack_timeout`` after they were advanced.
        """
        self.tracker.resolved(run)
        unresolved = self.unresolved
        if unresolved and unresolved[0] is run:
            unresolved.popleft()
            while unresolved and unresolved[0].pending == 0:
                unresolved.popleft()

    def force_fail(self, sub: Subscription, error: Exception, run: Run, index: int) -> None:
        """Count ``sub`` failed on everything it owes; its next pull raises ``error``.
        ``run`` and ``index`` locate the event that made it fail (for the log line)."""
        logger.warning(
            "Subscriber force-failed (%s) key=%r subscriber_id=%r lane=%r position=%d",
            type(error).__name__,
            self.key,
            sub.subscriber_id,
            run.lane_key(),
            run.position + index,
        )
        sub._failure = error
        self.active.discard(sub)
        if self.ack_mode:
            current = sub._current
            if current is not None:
                self._fail_current(sub, current)
            outputs = sub._outputs
            sub._outputs = {}
            for key, count in outputs.items():
                self.bindings.abandoned(count)
                if isinstance(key, tuple):
                    owed, index = key
                    self.mark(sub, owed, index, "failed", None)
                    self.release(sub, owed, count)
                else:  # a run of one event
                    self.mark(sub, key, 0, "failed", None)
                    self.part_done(sub, key, 1)
            batches = list(sub._batches)
            sub._batches.clear()
            for batch in batches:
                self.resolve_binding(sub, batch, "failed", None)
            self.bindings.abandoned(len(batches))
            self.departed.discard(sub)
        if not sub._left:
            self._skip_queued(sub)
        assert not self.ack_mode or not sub._parts, "a force-failed part stayed open"
        self._wake(sub)
        if self.blocked:
            self.room.set()
        self._check_health()

    # -- ack timeout ---------------------------------------------------------------

    def expire(self) -> None:
        now = self.clock()
        unresolved = self.unresolved
        while unresolved:
            run = unresolved[0]  # unresolved: ``_resolved`` pops resolved ones
            if now - run.broadcast_at < self.ack_timeout:
                return
            error_text = (
                f"subscriber did not resolve the event at position {run.position} "
                f"(lane {run.lane_key()!r}) within ack_timeout={self.ack_timeout}s. "
                + (
                    "The group is paused until this subscriber is subscribed again; raise "
                    "ack_timeout if handling (and confirming outputs) can take longer."
                    if self.roster is not None
                    else "Later events are advanced without this subscriber: declare "
                    "roster= if it must see every event, and raise ack_timeout if "
                    "handling (and confirming outputs) can take longer."
                )
            )
            for sub in [*self.members.values(), *self.departed]:
                if self._owes(sub, run):
                    self.force_fail(sub, AckTimeout(error_text), run, 0)
            assert run.pending == 0, "every subscriber owing an expired run was failed"
            assert not unresolved or unresolved[0] is not run

    @staticmethod
    def _owes(sub: Subscription, run: Run) -> bool:
        """Whether ``sub`` still owes part of ``run``, which fell due. A queued copy of
        ids it acked since the broadcast is counted acked here, as its hand-out would
        count it (SPEC §13): that is no debt to be force-failed for."""
        if sub._failure is not None:
            return False
        if run in sub._parts or run in sub._outputs:
            return True
        if sub._current is run:
            return not sub._current_resolved  # a run of one event, its window open
        return (
            not sub._left
            and sub._joined_at <= run.position
            and sub._cursor <= run.position
            and not (run.skipped is not None and sub._acked_earlier_copy(run))
        )

    async def _watch_timeouts(self) -> None:
        """Expire the oldest unresolved event when it falls due, without waiting for
        a pull or a broadcast to notice. Waits through the clock's ``sleep_until``
        when it has one (a fake clock fires it when moved), else on the loop's time."""
        loop = asyncio.get_running_loop()
        while True:
            unresolved = self.unresolved
            if not unresolved:
                self._timer_wakeup = loop.create_future()
                await self._timer_wakeup
                continue
            first = unresolved[0].broadcast_at
            now = self.clock()
            if now - first < self.ack_timeout:  # not due, by the same test as ``expire``
                # Rounding may put ``first + ack_timeout`` at or before ``now`` while
                # the event is not due yet: then wait for the clock to move at all.
                deadline = max(first + self.ack_timeout, math.nextafter(now, math.inf))
                if self._sleep_until is not None:
                    await self._sleep_until(deadline)
                else:
                    # Re-checked at least hourly, so an infinite ack_timeout is fine too.
                    await asyncio.sleep(min(deadline - now, 3600.0))
                continue
            self.expire()

    # -- polling and fan-out -------------------------------------------------------

    async def _poll(self) -> None:
        roster = self.roster
        try:
            if roster is not None:
                await self._healthy.wait()  # the whole roster is attached
            elif self._config.cohort_grace_period > 0:
                await asyncio.sleep(self._config.cohort_grace_period)
            stream, get_lane, batched = self._open()
        except asyncio.CancelledError:
            raise  # only the stop cancels the poll before the stream opens
        except Exception as exc:
            self._poll_exited = True
            self.terminate(StreamTerminated, f"the factory failed: {exc!r}", exc)
            return
        # Yield to the loop now and then even if the upstream never suspends, so
        # subscribers get to read before their queues fill up.
        fairness = max(1, self._queue_size // 4)
        blocking = self._config.overflow == "block" or roster is not None
        ack_mode = self.ack_mode
        tracker = self.tracker
        max_outstanding = tracker.max_outstanding
        since_yield = 0
        try:
            async for item in stream:
                if self.terminal is not None:
                    break
                if batched:
                    broadcast = await self._broadcast_batch(item, blocking, fairness)
                    if broadcast is None:
                        break
                    since_yield += broadcast
                    if since_yield >= fairness:
                        since_yield = 0
                        await asyncio.sleep(0)
                    continue
                if blocking and self._queue_size <= self.log.head - self._min_cursor_hint:
                    await self._make_room()
                    if self.terminal is not None:
                        break
                if not ack_mode:
                    self._broadcast(1, item, None, None)
                elif not (isinstance(item, tuple) and len(item) == 2):
                    raise TypeError(
                        "open_stream must yield (raw_event, broker_payload) pairs, "
                        f"got {type(item).__name__}"
                    )
                else:
                    raw, payload = item
                    lane_key = get_lane(payload) if get_lane is not None else None
                    get_id = self._get_event_id
                    event_id = get_id(payload) if get_id is not None else None
                    if roster is not None and not await self._until_healthy():
                        break
                    self._broadcast(
                        1, raw, payload, lane_key, None if event_id is None else (event_id,)
                    )
                    if tracker.outstanding >= max_outstanding:
                        assert tracker.outstanding == max_outstanding, "over max_outstanding"
                        # SPEC §9: pull nothing more until advances make room.
                        await tracker.wait_for_room()
                        if self.terminal is not None:
                            break
                since_yield += 1
                if since_yield >= fairness:
                    since_yield = 0
                    await asyncio.sleep(0)
            else:
                self.terminate(StreamTerminated, "the upstream ended")
        except asyncio.CancelledError as exc:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the stop cancelled the poll
            # Raised by the upstream itself, not by a cancellation of this task: a
            # failure like any other, or the group would stall silently.
            self._upstream_failed(exc)
        except Exception as exc:
            self._upstream_failed(exc)
        finally:
            # From here on the stop must not cancel the poll: that would cut the
            # stream's own ``finally`` short (SPEC §2 promises it runs).
            self._poll_exited = True
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _until_healthy(self) -> bool:
        """Rostered groups: hold the pulled event until every member is healthy.

        Expiry runs first: a member it force-fails must not be in the snapshot.
        Returns False if the group ended meanwhile.
        """
        while self.terminal is None:
            unresolved = self.unresolved
            if unresolved and self.clock() - unresolved[0].broadcast_at >= self.ack_timeout:
                self.expire()
            if self._healthy.is_set():
                return True
            await self._healthy.wait()
        return False

    def _upstream_failed(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            logger.error(
                "the upstream raised CancelledError itself; the group ends key=%r",
                self.key,
                exc_info=exc,
            )
        self.terminate(StreamTerminated, f"the upstream failed: {exc!r}", exc)

    def _open(self) -> tuple[Any, Callable[[Any], Hashable] | None, bool]:
        """The upstream to read, the lane function, and whether it yields batches."""
        made = self._factory()
        if not self.ack_mode:
            if not hasattr(made, "__anext__"):
                raise TypeError(
                    f"source() must return an async iterator, got {type(made).__name__}"
                )
            return made, None, False
        if not isinstance(made, SharedStreamProducer):
            raise TypeError(
                f"producer() must return a SharedStreamProducer, got {type(made).__name__}"
            )
        self._producer = made
        made._watch_upstream(self.upstream)
        if type(made).get_event_id is not SharedStreamProducer.get_event_id:
            self._get_event_id = made.get_event_id
        self.tracker.start(made)
        if type(made).open_stream_batches is not SharedStreamProducer.open_stream_batches:
            return made.open_stream_batches(), None, True
        return made.open_stream(), made.get_advance_lane, False

    async def _broadcast_batch(self, batch: object, blocking: bool, fairness: int) -> int | None:
        """Broadcast a fetched batch (``open_stream_batches``) as runs: every event as
        the per-event poll would, waiting for room between runs as it does (SPEC §3
        blocking, §7 health, §9 ``max_outstanding``) and yielding to the loop after
        every ``fairness`` events, so subscribers read before their queues fill up.
        A run ends where the per-event poll would have changed something between two
        events: room, health, an overflow. Returns how many events were broadcast,
        or ``None`` if the group ended before all of them were."""
        if not isinstance(batch, EventBatch):
            raise TypeError(
                f"open_stream_batches must yield EventBatch, got {type(batch).__name__}"
            )
        raws, payloads, lane_key, event_ids = batch
        total = len(raws)
        if (
            total == 0
            or len(payloads) != total
            or (event_ids is not None and len(event_ids) != total)
        ):
            raise TypeError(
                "an EventBatch needs at least one event and as many payloads (and event "
                f"ids, if given) as raw events: got {total} raw events, "
                f"{len(payloads)} payloads"
                + ("" if event_ids is None else f", {len(event_ids)} event ids")
            )
        tracker = self.tracker
        queue_size = self._queue_size
        done = 0
        while done < total:
            if done:
                # First, so the checks below hold when the run is broadcast: a member
                # may leave (a rostered group must not broadcast then) while we yield.
                await asyncio.sleep(0)
                if self.terminal is not None:
                    return None
            if blocking and queue_size <= self.log.head - self._min_cursor_hint:
                await self._make_room()
                if self.terminal is not None:
                    return None
            if self.roster is not None and not await self._until_healthy():
                return None
            count = min(total - done, tracker.max_outstanding - tracker.outstanding, fairness)
            room = queue_size - (self.log.head - self._min_cursor_hint)
            if room < count:
                # Perhaps a stale hint: ``_make_room`` returns at once while no member
                # is active, and the members subscribed since start at the head.
                room = queue_size - (self.log.head - self._refresh_min_cursor())
            if blocking:
                if room <= 0:
                    continue  # wait for room after all
                count = min(count, room)
            else:
                # The run ends at the event that overflows a subscriber, if any: the
                # events after it have a snapshot without that subscriber.
                count = min(count, room + 1)
            assert count > 0, "room for at least one event"
            if event_ids is not None and count > 1:
                count = self.redelivery.run_length(event_ids, done, count)
            self._broadcast_run(raws, payloads, lane_key, event_ids, done, done + count)
            done += count
            if tracker.outstanding >= tracker.max_outstanding:
                assert tracker.outstanding == tracker.max_outstanding, "over max_outstanding"
                await tracker.wait_for_room()  # SPEC §9
                if self.terminal is not None:
                    return None if done < total else done
        return done

    def _broadcast_run(
        self,
        raws: Sequence[Any],
        payloads: Sequence[Any],
        lane_key: Hashable,
        event_ids: Sequence[Hashable] | None,
        start: int,
        stop: int,
    ) -> None:
        """Broadcast events ``start..stop`` of a batch as one run. The caller made room
        for every one of them, and made sure only the last may overflow a subscriber."""
        if start or stop < len(payloads):
            payloads = payloads[start:stop]
            if event_ids is not None:
                event_ids = event_ids[start:stop]
        if stop - start == 1:
            self._broadcast(1, raws[start], payloads[0], lane_key, event_ids)
            return
        # The run's own copy of its raw events: read now, as a per-event poll would
        # read each event when it broadcasts it.
        self._broadcast(stop - start, raws[start:stop], payloads, lane_key, event_ids)

    def _about_to_broadcast(self, lane_key: Hashable) -> tuple[Lane, float, int]:
        """Ack mode, before broadcasting events of ``lane_key``: their lane, their
        broadcast instant and their snapshot size. Expires what fell due first, so the
        expired are not in the snapshot."""
        lanes = self.tracker.lanes
        lane = lanes.get(lane_key)  # TypeError if unhashable: ends the group
        if lane is None:
            lane = lanes[lane_key] = Lane(lane_key)
        now = self.clock()
        unresolved = self.unresolved
        if (
            unresolved
            and now - unresolved[0].broadcast_at >= self.ack_timeout
            and self.roster is None  # rostered: ``_until_healthy`` expired them
        ):
            self.expire()
        snapshot = len(self.active)
        assert self.roster is None or snapshot == len(self.roster), "snapshot is the roster"
        return lane, now, snapshot

    def _wake_waiters(self) -> None:
        """New events are in the log: every pull waiting for one looks again."""
        waiters = self.waiters
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            waiters.clear()  # each pull also discards its own: see ``waiters``

    def _broadcast(
        self,
        count: int,
        raws: Any,
        payloads: Any,
        lane_key: Hashable,
        event_ids: Sequence[Hashable] | None = None,
    ) -> None:
        """Append one run of ``count`` events of one lane to the log (``raws`` and
        ``payloads`` as :class:`~ackgate._log.Run` holds them). The caller made room
        for it; only its last event may overflow a subscriber."""
        log = self.log
        if self.ack_mode:
            tracker = self.tracker
            lane, now, snapshot = self._about_to_broadcast(lane_key)
            memory = None if event_ids is None else self.redelivery.remember(event_ids)
            run = Run(log.head, count, raws, payloads, lane, snapshot, now, memory)
            if run.skipped is not None and snapshot:
                self._carry_over(run)
            lane.runs.append(run)
            tracker.outstanding += run.count
            if run.pending:
                unresolved = self.unresolved
                wakeup = self._timer_wakeup
                if not unresolved and wakeup is not None and not wakeup.done():
                    wakeup.set_result(None)
                unresolved.append(run)
            else:
                tracker.resolved(run)  # nobody to wait for
        else:
            snapshot = len(self.active)
            run = Run(log.head, count, raws, payloads, None, snapshot, 0.0)
        log.append(run)
        if snapshot and log.head - self._min_cursor_hint > self._queue_size:
            self._fail_overflowing(run)
        self._wake_waiters()

    def _carry_over(self, run: Run) -> None:
        """A redelivered copy: who acked an earlier copy of every event of it is
        counted acked at once (and passes it without being handed it)."""
        memory = run.memory
        assert memory is not None
        skipped = 0
        for sub in self.active:
            bit = sub._bit
            if bit is not None and (
                memory.acked_by(1 << bit) or sub._acked_in_open_part(memory.in_range)
            ):
                skipped |= 1 << bit
                run.pending -= 1
                self._count_skip(sub, run.count)
        run.skipped = skipped

    def skip_at_hand_out(self, run: Run, sub: Subscription, flag: int) -> None:
        """Caller: ``Subscription._acked_earlier_copy``. ``sub`` acked an earlier copy
        of every event of ``run`` after its broadcast and is not handed it: counted
        acked for it now, exactly as ``_carry_over`` would have at the broadcast."""
        assert run.pending > 0, "resolved more often than its snapshot allows"
        assert run.skipped is not None, "a redelivered copy"
        run.skipped |= flag
        self._count_skip(sub, run.count)
        run.pending -= 1
        if run.pending == 0:
            self._resolved(run)

    def _count_skip(self, sub: Subscription, events: int) -> None:
        by = self.redeliveries_skipped_by
        by[sub.subscriber_id] = by.get(sub.subscriber_id, 0) + events
        self.redeliveries_skipped += events

    def _refresh_min_cursor(self) -> int:
        self._min_cursor_hint = min((sub._cursor for sub in self.active), default=self.log.head)
        return self._min_cursor_hint

    def _fail_overflowing(self, run: Run) -> None:
        head = self.log.head
        if head - self._refresh_min_cursor() <= self._queue_size:
            return
        position = run.position + run.count - 1
        for sub in [s for s in self.active if head - s._cursor > self._queue_size]:
            self.force_fail(
                sub,
                SubscriberOverflow(
                    f"more than subscriber_queue_size={self._queue_size} unread events "
                    f"at position {position}: the subscriber fell behind and later "
                    "events are advanced without it. Declare roster= if it must see every "
                    'event (a rostered group waits for room), or use overflow="block", '
                    "or a larger subscriber_queue_size."
                ),
                run,
                run.count - 1,
            )
        self._refresh_min_cursor()

    async def _make_room(self) -> None:
        """overflow="block": wait until every active subscriber has room for one more."""
        while self.terminal is None and self.active:
            if self.log.head - self._refresh_min_cursor() < self._queue_size:
                return
            self.blocked = True
            self.room.clear()
            try:
                await self.room.wait()
            finally:
                self.blocked = False

    # -- ending --------------------------------------------------------------------

    def _abandon_bindings(self) -> None:
        """The group stopped: what is unresolved now is abandoned to redelivery.

        Outputs bound to its events can never count any more, and a member still
        on an event binds nothing more to it (``bind`` returns ``None``), so no
        number keeps the stopped group alive. Nothing expires any more either.
        """
        self.unresolved.clear()
        abandoned = 0
        for sub in [*self.members.values(), *self.departed]:
            abandoned += sum(sub._outputs.values()) + len(sub._batches)
            sub._outputs.clear()
            sub._batches.clear()
            sub._parts.clear()
            if sub._current is not None:
                sub._current_resolved = True
        self.departed.clear()
        self.bindings.abandoned(abandoned, sweep=True)

    def _advance_failed(self, exc: BaseException) -> None:
        logger.error("advance raised; the group ends key=%r", self.key, exc_info=exc)
        self.terminate(AdvanceFailed, f"the producer's advance failed: {exc!r}", exc)

    def terminal_error(self) -> StreamTerminated:
        assert self.terminal is not None
        kind, message, cause = self.terminal
        error = kind(message)
        error.__cause__ = cause
        return error

    def terminate(
        self,
        kind: type[StreamTerminated],
        reason: str,
        cause: BaseException | None = None,
    ) -> None:
        """End the group (first reason wins) and start the stop task."""
        if self.terminal is not None:
            if kind is AdvanceFailed:
                self.tracker.halt()
            return
        self.terminal = (kind, reason, cause)
        if kind is AdvanceFailed:
            self.tracker.halt()
        for sub in list(self.active):
            self._skip_queued(sub)
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()
        for sub in self.members.values():
            if sub._unusable is not None:
                sub._unusable.set()
        self.room.set()
        self.stop_task = asyncio.get_running_loop().create_task(self._stop(reason))
        self._release(self)

    async def _stop(self, reason: str) -> None:
        """Polling ends, resolved prefixes are advanced, the producer is closed once.

        On the way the tracker halts (no advance is in flight or starts after it)
        and the bindings of outputs never confirmed are abandoned, so the output
        registry does not keep the stopped group alive.

        Cancellation (only if the loop itself is torn down) skips the remaining
        advances; the producer is still closed.
        """
        try:
            if not self._poll_exited:
                self._poll_task.cancel()
            await asyncio.gather(self._poll_task, return_exceptions=True)
            if self._timer_task is not None:
                self._timer_task.cancel()
                await asyncio.gather(self._timer_task, return_exceptions=True)
            await self.tracker.drain()
        finally:
            self.tracker.halt()
            self._abandon_bindings()
            if self._pause_warning is not None:
                self._pause_warning.cancel()
            if self._producer is not None:
                try:
                    await self._producer.aclose()
                except Exception:
                    logger.warning("producer aclose() failed key=%r", self.key, exc_info=True)
                # A closed producer's reports would reach the key's next group.
                self._producer._watch_upstream(None)
            logger.info("Shared stream group stopped key=%r reason=%s", self.key, reason)
