"""A group: one upstream poll shared by every subscriber of one key.

Topology: the poll task reads the producer (or source) and appends each run of
events (a fetched batch, or one event) to the fan-out log (:mod:`ackgate._core.fanout`);
subscriptions read the log through their cursors (:mod:`ackgate._core.subscription`);
resolutions are counted on the run, per event only where a subscriber treated one
differently, and the lane tracker advances resolved prefixes (:mod:`ackgate._core.tracker`).

A group is built in layers, one concept per module, each using only those below
it (their shared state: :mod:`ackgate._core.group_state`): resolution
(:mod:`ackgate._core.resolution`), membership (:mod:`ackgate._core.membership`), the ack
timeout (:mod:`ackgate._core.timeouts`), intake (:mod:`ackgate._core.intake`), and here the
group itself: its state, set up once, and its lifecycle.

Lifecycle: *running* until the first of: the upstream ends or misbehaves, an
advance raises, the last subscriber leaves, the manager closes. Then
:meth:`Group.terminate` runs once: the key is released at once, subscribers
still iterating get ``terminal_error()``, and a stop task cancels polling,
advances what is already resolved, and closes the producer exactly once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from ackgate._contract.errors import (
    AdvanceFailed,
    StreamTerminated,
)
from ackgate._contract.producer import SharedStreamProducer
from ackgate._contract.stats import OldestOutstanding
from ackgate._contract.upstream import Upstream
from ackgate._core.bindings import OutputRegistry
from ackgate._core.fanout import EventLog, Run
from ackgate._core.group_state import GroupConfig
from ackgate._core.intake import Intake
from ackgate._core.progress import GroupProgress
from ackgate._core.redelivery import RedeliveryMemory
from ackgate._core.subscription import Subscription
from ackgate._core.tracker import LaneTracker

logger = logging.getLogger("ackgate.group")

#: How many event ids a group remembers to skip redelivered copies
#: (docs/concepts.md#redelivery-memory).
_REMEMBERED_EVENT_IDS = 65_536


class Group(Intake):
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
        #: The declared subscriber ids (docs/concepts.md#snapshot-and-roster), in the order first
        #: given; ``None``: dynamic.
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
        #: Subscriptions created so far: the next one's subscription order
        #: (docs/concepts.md#deferred-resolution).
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
        #: Who acked which event ids, to skip them on a redelivered copy
        #: (docs/concepts.md#redelivery-memory).
        self.redelivery = RedeliveryMemory(_REMEMBERED_EVENT_IDS)
        #: The memory, per roster member, for a producer that carries it across the
        #: group's lives (``SharedStreamProducer._watch_subscriber_progress``).
        self.progress = GroupProgress(self.redelivery, roster, self.members)
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

    # -- observing -----------------------------------------------------------------

    def oldest_outstanding(self, now: float) -> OldestOutstanding | None:
        """The oldest run not advanced yet (its first event) and the members holding it.
        O(lanes + members)."""
        run = self.tracker.oldest_run()
        if run is None:
            return None
        holders = tuple(sid for sid, sub in self.members.items() if sub.holds(run))
        raw = run.raws if run.count == 1 else run.raws[0]
        return OldestOutstanding(run.lane_key(), max(0.0, now - run.broadcast_at), holders, raw)

    def behind(self) -> dict[Hashable, int]:
        """Per member, the events broadcast that it has not resolved. O(what the
        members hold), not O(outstanding events)."""
        return {sid: sub.unresolved_events() for sid, sub in self.members.items()}

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
                self._producer._watch_subscriber_progress(None)
            logger.info("Shared stream group stopped key=%r reason=%s", self.key, reason)
