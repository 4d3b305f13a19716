"""Intake: the poll reads the producer and broadcasts runs to the fan-out log.

One poll task per group reads ``open_stream`` (one event at a time) or
``open_stream_batches`` (fetched batches, broadcast as runs), waits for room
(``overflow="block"``, rostered groups, ``max_outstanding``) and for a healthy
roster, and appends each run with its snapshot to the log. A redelivered copy is
checked against the redelivery memory here (:mod:`ackgate._core.redelivery`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ackgate._contract.errors import StreamTerminated, SubscriberOverflow
from ackgate._contract.outcome import EventBatch
from ackgate._contract.producer import SharedStreamProducer, overrides
from ackgate._core.fanout import Lane, Run
from ackgate._core.subscription import Subscription
from ackgate._core.timeouts import Timeouts

logger = logging.getLogger("ackgate.group")


class Intake(Timeouts):
    """The intake layer of a group."""

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
                        # docs/production.md#max_outstanding: pull nothing more until advances make
                        # room.
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
            # From here on the stop must not cancel the poll: that would cut the stream's own
            # ``finally`` short (docs/writing-an-adapter.md#1-the-producer promises it runs).
            self._poll_exited = True
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def stop_polling(self) -> None:
        """Read nothing more from the upstream; the group goes on otherwise.

        Caller: a service's graceful stop, before its handlers' grace period. Events
        received from now on would never be handed to a handler, and the broker
        would count a delivery for each (an SQS receive, a Pub/Sub delivery
        attempt) that no handler saw. What is broadcast already still resolves and
        is advanced; what the poll had fetched and not broadcast yet is not
        advanced, so the broker redelivers it. The group ends as before, when its
        last member leaves. Idempotent.
        """
        if not self._poll_exited:
            self._poll_task.cancel()  # the stream's ``finally`` runs (``_poll``)

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
        made._watch_subscriber_progress(self.progress)
        if overrides(made, "get_event_id"):
            self._get_event_id = made.get_event_id
        self.tracker.start(made)
        if overrides(made, "open_stream_batches"):
            return made.open_stream_batches(), None, True
        return made.open_stream(), made.get_advance_lane, False

    async def _broadcast_batch(self, batch: object, blocking: bool, fairness: int) -> int | None:
        """Broadcast a fetched batch (``open_stream_batches``) as runs: every event as
        the per-event poll would, waiting for room between runs as it does (docs/concepts.md#window
        blocking, a roster's health, ``max_outstanding``) and yielding to the loop after
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
                await tracker.wait_for_room()  # docs/production.md#max_outstanding
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
        ``payloads`` as :class:`~ackgate._core.fanout.Run` holds them). The caller made room
        for it; only its last event may overflow a subscriber."""
        # Once per run, and per event on the per-event path: kept flat.
        log = self.log
        if self.ack_mode:
            tracker = self.tracker
            lanes = tracker.lanes
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
                self.expire()  # first, so the expired are not in the snapshot
            snapshot = len(self.active)
            assert self.roster is None or snapshot == len(self.roster), "snapshot is the roster"
            memory = None if event_ids is None else self.redelivery.remember(event_ids)
            run = Run(log.head, count, raws, payloads, lane, snapshot, now, memory)
            if run.skipped is not None and snapshot:
                self._carry_over(run)
            lane.runs.append(run)
            tracker.outstanding += count
            if run.pending:
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
        if self.waiters:
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
