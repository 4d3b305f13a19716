"""Resolution: how a subscriber's part in a run resolves, and the run with it.

A subscriber resolves its part in a run: all of the run's events. Acks are the
default (nothing is recorded per event); a reject or a failure of one event is a
mark (``Resolutions.mark``), of every event of a run it was never handed a count on
the run (``_fail_unhanded``). The part is resolved once nothing holds it any more
(``release``; what holds a part: :mod:`ackgate._core.subscription`); the run, once every
part is, and the lane tracker (:mod:`ackgate._core.tracker`) advances it then.
"""

from __future__ import annotations

from ackgate._core.bindings import BatchBinding
from ackgate._core.fanout import Resolution, Run
from ackgate._core.group_state import GroupState
from ackgate._core.subscription import Subscription


class Resolutions(GroupState):
    """The resolution layer of a group."""

    def release(self, sub: Subscription, run: Run, holds: int = 1) -> None:
        """``holds`` of ``sub``'s holds on its part in ``run`` ended (module
        ``ackgate._core.subscription``): the part is resolved once none is left."""
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
        if run.count == 1:
            self._count_whole(sub, run, how, reason)
            return
        marks = self.tracker.marks.setdefault(run, {})
        counts = marks.get(index)
        if counts is None:
            counts = marks[index] = [0, 0]
        counts[0 if how == "failed" else 1] += 1
        if reason is not None and how == "rejected":
            self._keep_reason(run, index, sub, reason)

    def _count_whole(
        self, sub: Subscription, run: Run, how: Resolution, reason: str | None
    ) -> None:
        """``sub`` failed or rejected every event of ``run`` alike: one count on the
        run (a reject ``reason`` kept for all of its events)."""
        if how == "failed":
            run.failed += 1
        else:
            run.rejected += 1
            if reason is not None:
                self._keep_reason(run, None, sub, reason)

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
                self._count_whole(sub, run, how, reason)
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
