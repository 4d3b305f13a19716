"""The calls of one handler on one subscription: bounded, ordered, retried, resolved.

The subscription's feed pulls a message (or a batch), binds one ticket per message
and :meth:`Calls.submit` s a :class:`~ackgate._service.jobs.Job`; it pulls again once
:attr:`Calls.active` is below :attr:`Calls.capacity`. A job runs as soon as a call
slot is free (at most ``concurrency`` calls at once) and no earlier job with the
same ordering key is still running or waiting. Its call is retried per the
handler's :class:`~ackgate.Retry`; then its tickets are resolved exactly once:
``confirm_persisted`` (the call returned), ``reject_bound`` (``Reject``) or, when
the handler gives up on it (``give_up_after``), a reject too.

A job that failed every call is not failed to the broker: it is *parked* for the
handler's :class:`~ackgate.Redelivery` backoff, its tickets unresolved and its
ordering key still taken (what the handler's ``ordering`` ties to it waits behind
it; nothing else does), then handed to the same handler again
(docs/failure-semantics.md#redelivery-to-the-failing-handler). Only when the next hand-out
would come later than half the ack timeout after the job was submitted does it fail
(``fail_bound``: the broker redelivers it, with a fresh ack timeout), so the ack
timeout never force-fails a handler for waiting out a backoff. Parked jobs and the
jobs behind their keys do not count against ``capacity``: the handler goes on
pulling other keys; they stay bounded by the group's ``max_outstanding``. Stopping
drops the jobs that have not started and the parked ones (their tickets fail: the
broker redelivers them).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any

from ackgate._contract.message import Message, Reject
from ackgate._service.handlers import HandlerCounters, HandlerSpec
from ackgate._service.jobs import UNORDERED, Job, describe
from ackgate._service.resolutions import Resolutions
from ackgate._service.retry import Redelivery
from ackgate._service.unresolved import UnresolvedCalls

if TYPE_CHECKING:
    from ackgate._core.manager import SharedStreamManager

logger = logging.getLogger("ackgate.service")

#: Per-message handlers hold at least this many jobs: the feed then pulls them in one
#: step and a slot runs them back to back, instead of a feed wake-up per message.
_MIN_HELD_MESSAGES = 32

__all__ = ["UNORDERED", "Calls", "Job"]


class Calls(Resolutions):
    """The jobs of one handler's subscription, from submission to resolution.

    A *slot* is a task that runs ready jobs one after another and ends when none is
    ready: a busy handler creates no task per message, and the next job of a lane
    starts in the same step its predecessor ended. Slots run in a copy of the context
    ``Calls`` was made in, not the feed's: the feed's context names the subscription
    it is iterating, and ``reject_shared_stream_event()`` from a handler must not
    reject whatever event the feed is on (it logs a warning instead; handlers raise
    :class:`~ackgate.Reject`).
    """

    def __init__(
        self,
        spec: HandlerSpec,
        manager: SharedStreamManager,
        counters: HandlerCounters,
        on_exit: Callable[[BaseException], None],
        unresolved: UnresolvedCalls,
        invoke: Callable[[Job], Awaitable[Any]] | None = None,
        redelivery: Redelivery | None = None,
    ) -> None:
        self._spec = spec
        #: Told of a KeyboardInterrupt or SystemExit a call raised (the service stops).
        self._on_exit = on_exit
        self._unresolved = unresolved
        #: Makes the call instead of ``spec.function(job.argument)`` (telemetry's span
        #: and timing); ``None`` without instrumentation, so the call costs nothing more.
        self._invoke = invoke
        self._manager = manager
        #: ``manager.confirm_persisted`` without its argument check and thread
        #: hand-off: calls run on the manager's loop, and tickets are lists of ints.
        self._confirm = manager._bindings.confirm
        self._counters = counters
        self._concurrency = spec.concurrency
        self._redelivery = spec.redelivery or redelivery or Redelivery()
        #: The group's clock (a test's FakeClock moves backoffs too) and ack timeout.
        self._clock = manager._config.clock
        self._ack_timeout = manager._config.ack_timeout
        #: How many jobs the feed may hold before it waits: per-message handlers hold
        #: twice their concurrency (at least ``_MIN_HELD_MESSAGES``), so a slot that
        #: ends a call finds the next one ready (and a busy key does not idle every
        #: slot); batch handlers fill their next batch while ``concurrency`` batches run.
        self.capacity = (
            spec.concurrency + 1 if spec.batched else max(2 * spec.concurrency, _MIN_HELD_MESSAGES)
        )
        #: Jobs submitted and not finished. Invariant: ``held == (jobs in slots) +
        #: len(_ready) + sum(map(len, _behind.values())) + parked``.
        self.held = 0
        #: Jobs waiting out a redelivery backoff (``_waits``), and jobs behind the keys
        #: of parked jobs. Invariant: ``blocked == sum(len(_behind[k]) for k in
        #: _parked_keys)``.
        self.parked = 0
        self.blocked = 0
        self._parked_keys: set[Hashable] = set()
        self._waits: dict[Job, asyncio.Task[None]] = {}
        #: Running slots. Invariants: ``len(_slots) <= concurrency``; a slot ends only
        #: when ``_ready`` is empty (or closed), so ready jobs never wait for a free slot.
        self._slots: set[asyncio.Task[None]] = set()
        #: Jobs free to start (no earlier job of their key left), in submission order.
        self._ready: deque[Job] = deque()
        #: Per ordering key with a job running, ready or parked: the jobs behind it.
        self._behind: dict[Hashable, deque[Job]] = {}
        self._room: asyncio.Future[None] | None = None
        self._context = contextvars.copy_context()
        #: Set by :meth:`close`: no job starts any more.
        self._closed = False

    @property
    def active(self) -> int:
        """The jobs held that count against ``capacity``: all but the parked ones and
        those behind their keys."""
        return self.held - self.parked - self.blocked

    # -- feeding ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Take ``job``: it starts at once if its key and a slot are free, else waits.
        Once closed, its tickets fail at once: it is never handed to the handler."""
        if self._closed:
            job.resolved = True
            self._manager.fail_bound(job.seqs)
            return
        self.held += 1
        job.handed_at = self._clock()
        key = job.key
        if key is not UNORDERED:
            behind = self._behind.get(key)
            if behind is not None:
                behind.append(job)
                if key in self._parked_keys:
                    self.blocked += 1
                return
            self._behind[key] = deque()
        self._ready.append(job)
        self._start_slot()

    def _start_slot(self) -> None:
        if len(self._slots) < self._concurrency:
            slot = self._slot()
            loop = asyncio.get_running_loop()
            self._slots.add(loop.create_task(slot, context=self._context.copy()))

    async def wait_room(self) -> None:
        """Wait until ``active < capacity``. Cancellation: nothing changes."""
        while self.active >= self.capacity:
            room = self._room = asyncio.get_running_loop().create_future()
            try:
                await room
            finally:
                self._room = None

    def _signal_room(self) -> None:
        room = self._room
        if room is not None and self.active < self.capacity and not room.done():
            room.set_result(None)

    # -- stopping -----------------------------------------------------------------

    def close(self) -> None:
        """Start no job any more: the jobs not started and the parked ones fail at once
        (the broker redelivers them), later submissions too. Calls in progress go on.
        Idempotent."""
        self._closed = True
        self._drop_waiting()

    async def finish(self, deadline: float) -> None:
        """:meth:`close`, give running calls until ``deadline`` (loop time), then cancel
        the rest. Cancellation: every call is cancelled (its tickets fail) and this
        returns without waiting for them."""
        self.close()
        try:
            if self._slots:
                timeout = max(0.0, deadline - asyncio.get_running_loop().time())
                await asyncio.wait(set(self._slots), timeout=timeout)
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Start nothing more, cancel every call, fail every ticket not resolved yet.

        Returns once the cancelled calls have ended. Idempotent. Cancellation: the
        calls are cancelled already; this stops waiting for them.
        """
        self.close()
        slots = list(self._slots)
        for slot in slots:
            slot.cancel()
        if slots:
            await asyncio.gather(*slots, return_exceptions=True)

    def _drop_waiting(self) -> None:
        dropped = list(self._ready)
        self._ready.clear()
        for behind in self._behind.values():
            dropped.extend(behind)
            behind.clear()
        for job, wait in self._waits.items():
            wait.cancel()
            dropped.append(job)
        self._waits.clear()
        self._parked_keys.clear()
        self.parked = self.blocked = 0
        self._counters.awaiting_redelivery = 0
        if dropped:
            self.held -= len(dropped)
            for job in dropped:
                job.resolved = True
            self._manager.fail_bound([seq for job in dropped for seq in job.seqs])

    # -- redelivering ---------------------------------------------------------------

    def _park(self, job: Job, delay: float) -> None:
        """Hand ``job`` to the handler again in ``delay`` seconds; until then its key
        stays taken and it takes no slot. Caller: the slot that ran it."""
        self.parked += 1
        self._counters.awaiting_redelivery += self._waiting_messages(job)
        key = job.key
        if key is not UNORDERED:
            self._parked_keys.add(key)
            self.blocked += len(self._behind[key])
        loop = asyncio.get_running_loop()
        # Due from now, not from when the task first runs: a FakeClock may move first.
        due = self._clock() + delay
        self._waits[job] = loop.create_task(self._wait_out(job, due))
        self._signal_room()

    async def _wait_out(self, job: Job, due: float) -> None:
        sleep_until = getattr(self._clock, "sleep_until", None)
        if sleep_until is not None:  # a test's FakeClock: moved by hand
            await sleep_until(due)
        else:
            await asyncio.sleep(max(0.0, due - self._clock()))
        del self._waits[job]
        self.parked -= 1
        self._counters.awaiting_redelivery -= self._waiting_messages(job)
        key = job.key
        if key is not UNORDERED:
            self._parked_keys.discard(key)
            self.blocked -= len(self._behind[key])
        self._ready.appendleft(job)  # the oldest job held: it goes first
        self._start_slot()

    @staticmethod
    def _waiting_messages(job: Job) -> int:
        """The messages of parked ``job`` still to be handed (not given up on)."""
        return len(job.messages) - len(job.apart or ())

    # -- running ------------------------------------------------------------------

    async def _slot(self) -> None:
        slot = asyncio.current_task()
        ready = self._ready
        counters = self._counters
        waits = self._waits
        try:
            while ready and not self._closed:
                job = ready.popleft()
                size = len(job.messages)
                counters.in_progress += size
                try:
                    await self._attempts(job)
                finally:
                    counters.in_progress -= size
                    if job not in waits:
                        if not job.resolved:  # cancelled, or a BaseException from the handler
                            job.resolved = True
                            self._manager.fail_bound(job.seqs)
                            self._cut_short(job)
                        self._finished(job)
        finally:
            # At once, not in a done callback: a job submitted from now on needs a new slot.
            self._slots.discard(slot)

    def _finished(self, job: Job) -> None:
        """Caller: the slot that ran ``job``; it takes the next ready job, if any."""
        self.held -= 1
        key = job.key
        if key is not UNORDERED:
            behind = self._behind.get(key)
            if behind:
                self._ready.append(behind.popleft())  # the key stays taken
            else:
                self._behind.pop(key, None)
        self._signal_room()

    def _show(self, job: Job) -> None:
        """Set ``job.shown`` and ``job.argument`` for this hand-out: each message with
        ``attempt`` as this handler counts it (a plain copy only where it differs)."""
        handler_id = self._spec.id
        attempt_of = self._unresolved.attempt
        shown: list[Message] = []
        changed = False
        for message in job.messages:
            attempt = attempt_of(handler_id, message)
            if attempt != message.attempt:
                message = dataclasses.replace(message, attempt=attempt)
                changed = True
            shown.append(message)
        if not changed:
            job.shown = job.messages
        else:
            job.shown = shown
        if not self._spec.batched:
            job.argument = job.shown[0]
        else:
            apart = job.apart
            job.argument = [m for i, m in enumerate(job.shown) if apart is None or i not in apart]

    async def _attempts(self, job: Job) -> None:
        spec = self._spec
        self._show(job)
        if spec.give_up_after is not None and self._give_up_unresolved(job, spec.give_up_after):
            return
        retry = spec.retry
        counters = self._counters
        size = len(job.argument) if spec.batched else 1
        invoke = self._invoke
        call = 1
        while True:
            try:
                rejects = self._result(
                    await (spec.function(job.argument) if invoke is None else invoke(job))
                )
            except Reject as reject:
                job.resolved = True
                self._manager.reject_bound(job.seqs, reason=reject.reason)
                counters.rejected += size
                logger.info("handler %r rejected %s: %s", spec.id, describe(job), reject.reason)
                return
            except (Exception, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and _cancelling():
                    raise  # this call is cancelled (stop, ack timeout, the loop's teardown)
                # A CancelledError the handler's own code raised (a future it awaited
                # was cancelled) is a failure of this call like any other: retried, then
                # failed, and the lane goes on (docs/production.md#handler-mistakes).
                if call < retry.attempts:
                    delay = retry.delay(call)
                    logger.warning(
                        "handler %r failed on %s (call %d of %d), retrying in %.3gs: %r",
                        spec.id,
                        describe(job),
                        call,
                        retry.attempts,
                        delay,
                        exc,
                    )
                    counters.retried += size
                    call += 1
                    await asyncio.sleep(delay)
                    continue
                self._failed(job, exc, call)
                return
            except BaseException as exc:  # KeyboardInterrupt, SystemExit: stop the service
                # Not re-raised here: out of a task it would leave the event loop at
                # once, before anything stopped. The service stops gracefully, then
                # run() raises it.
                job.resolved = True
                self._manager.fail_bound(job.seqs)
                counters.failed += size
                logger.error(
                    "handler %r raised %r on %s; the service stops (the message is "
                    "redelivered), then run() raises it",
                    spec.id,
                    exc,
                    describe(job),
                    exc_info=exc,
                )
                self._on_exit(exc)
                return
            job.resolved = True
            if rejects:
                self._resolve_batch(job, rejects)
            else:
                self._confirm(job.seqs)
                counters.handled += size
            return


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
