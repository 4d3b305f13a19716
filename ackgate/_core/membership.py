"""Membership: who is in a group's snapshot, and what leaving or failing costs.

A subscriber joins (it gets its redelivery bit and subscription order), leaves
(cleanly: done with its open event; crashed: it fails), or is force-failed (ack
timeout, overflow): it leaves the snapshot of later events, and what it owed
resolves as failed, except the queued copies of ids it acked (counted acked).
A rostered group is *healthy* while every roster member is active, and broadcasts
only then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable

from ackgate._contract.errors import StreamTerminated
from ackgate._core.fanout import Run
from ackgate._core.resolution import Resolutions
from ackgate._core.subscription import Subscription

logger = logging.getLogger("ackgate.group")

#: Seconds a rostered group may stay paused after a clean leave before a WARNING.
_CLEAN_LEAVE_GRACE = 1.0


class Membership(Resolutions):
    """The membership layer of a group."""

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
