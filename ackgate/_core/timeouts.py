"""The ack timeout: a run not resolved within ``ack_timeout`` of its broadcast
force-fails every subscriber that still owes part of it.

Checked on every pull and broadcast, and by a timer task (``_watch_timeouts``) that
sleeps until the oldest unresolved run falls due, so nothing waits for a pull.
"""

from __future__ import annotations

import asyncio
import math

from ackgate._contract.errors import AckTimeout
from ackgate._core.fanout import Run
from ackgate._core.membership import Membership
from ackgate._core.subscription import Subscription


class Timeouts(Membership):
    """The ack-timeout layer of a group."""

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
        count it (docs/concepts.md#redelivery-memory): that is no debt to be force-failed for."""
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
