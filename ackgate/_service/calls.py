"""The calls of one handler on one subscription: bounded, ordered, retried, resolved.

The subscription's feed pulls a message (or a batch), binds one ticket per message
and :meth:`Calls.submit` s a :class:`Job`; it pulls again once
:attr:`Calls.held` is below :attr:`Calls.capacity`. A job runs as soon as a call
slot is free (at most ``concurrency`` calls at once) and no earlier job with the
same ordering key is still running or waiting. Its call is retried per the
handler's :class:`~ackgate.Retry`; then its tickets are resolved exactly once:
``confirm_persisted`` (the call returned), ``reject_bound`` (``Reject``) or
``fail_bound`` (it failed every call, or was cancelled). With ``give_up_after``, a
failure at that delivery attempt is a reject instead, and a message whose earlier
deliveries were never resolved by this handler that many times is rejected before
any call (:mod:`ackgate._service.unresolved`). Stopping drops the jobs that have not
started (their tickets fail: the broker redelivers them).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ackgate._contract.message import Message, Reject
from ackgate._service.handlers import HandlerCounters, HandlerSpec
from ackgate._service.unresolved import UnresolvedCalls

if TYPE_CHECKING:
    from ackgate._core.manager import SharedStreamManager

logger = logging.getLogger("ackgate.service")

#: Per-message handlers hold at least this many jobs: the feed then pulls them in one
#: step and a slot runs them back to back, instead of a feed wake-up per message.
_MIN_HELD_MESSAGES = 32

#: The ordering key of a job that waits for no other job.
UNORDERED: Any = object()


class Job:
    """One handler call to make: its argument, its messages and their tickets."""

    __slots__ = ("apart", "argument", "key", "messages", "resolved", "seqs", "sizes")

    def __init__(
        self,
        argument: Any,
        messages: Sequence[Message],
        seqs: Sequence[int],
        key: Hashable,
        sizes: Sequence[int] | None = None,
    ) -> None:
        #: What the handler is called with: a Message, or a list of them (batches).
        self.argument = argument
        self.messages = messages
        #: The tickets of ``messages``: one per message, or with ``sizes`` one per
        #: batch binding (``Subscription.pull_batch``), ``sizes[i]`` messages each,
        #: in the same order.
        self.seqs = seqs
        self.sizes = sizes
        #: Jobs with an equal key run one at a time, in submission order.
        self.key = key
        #: Set once the tickets were resolved. Invariant: they are resolved exactly once.
        self.resolved = False
        #: Batch jobs: indexes of ``messages`` resolved before the call (given up on,
        #: see ``Calls._give_up_unresolved``; rejected or skipped at hand-out, see
        #: ``feed.handed_out``) and left out of ``argument``.
        self.apart: set[int] | None = None


class Calls:
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
        #: How many jobs the feed may hold before it waits: per-message handlers hold
        #: twice their concurrency (at least ``_MIN_HELD_MESSAGES``), so a slot that
        #: ends a call finds the next one ready (and a busy key does not idle every
        #: slot); batch handlers fill their next batch while ``concurrency`` batches run.
        self.capacity = (
            spec.concurrency + 1 if spec.batched else max(2 * spec.concurrency, _MIN_HELD_MESSAGES)
        )
        #: Jobs submitted and not finished. Invariant: ``held == (jobs in slots) +
        #: len(_ready) + sum(map(len, _behind.values()))``.
        self.held = 0
        #: Running slots. Invariants: ``len(_slots) <= concurrency``; a slot ends only
        #: when ``_ready`` is empty (or closed), so ready jobs never wait for a free slot.
        self._slots: set[asyncio.Task[None]] = set()
        #: Jobs free to start (no earlier job of their key left), in submission order.
        self._ready: deque[Job] = deque()
        #: Per ordering key with a job running or ready: the jobs waiting behind it.
        self._behind: dict[Hashable, deque[Job]] = {}
        self._room: asyncio.Future[None] | None = None
        self._context = contextvars.copy_context()
        #: Set by :meth:`close`: no job starts any more.
        self._closed = False

    # -- feeding ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Take ``job``: it starts at once if its key and a slot are free, else waits.
        Once closed, its tickets fail at once: it is never handed to the handler."""
        if self._closed:
            job.resolved = True
            self._manager.fail_bound(job.seqs)
            return
        self.held += 1
        key = job.key
        if key is not UNORDERED:
            behind = self._behind.get(key)
            if behind is not None:
                behind.append(job)
                return
            self._behind[key] = deque()
        self._ready.append(job)
        if len(self._slots) < self._concurrency:
            slot = self._slot()
            loop = asyncio.get_running_loop()
            self._slots.add(loop.create_task(slot, context=self._context.copy()))

    async def wait_room(self) -> None:
        """Wait until ``held < capacity``. Cancellation: nothing changes."""
        while self.held >= self.capacity:
            room = self._room = asyncio.get_running_loop().create_future()
            try:
                await room
            finally:
                self._room = None

    # -- stopping -----------------------------------------------------------------

    def close(self) -> None:
        """Start no job any more: the jobs not started fail at once (the broker
        redelivers them), later submissions too. Calls in progress go on. Idempotent."""
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
        if dropped:
            self.held -= len(dropped)
            for job in dropped:
                job.resolved = True
            self._manager.fail_bound([seq for job in dropped for seq in job.seqs])

    # -- running ------------------------------------------------------------------

    async def _slot(self) -> None:
        slot = asyncio.current_task()
        ready = self._ready
        counters = self._counters
        try:
            while ready and not self._closed:
                job = ready.popleft()
                size = len(job.messages)
                counters.in_progress += size
                try:
                    await self._attempts(job)
                finally:
                    counters.in_progress -= size
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
        room = self._room
        if room is not None and self.held < self.capacity and not room.done():
            room.set_result(None)

    async def _attempts(self, job: Job) -> None:
        spec = self._spec
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
                logger.info("handler %r rejected %s: %s", spec.id, _describe(job), reject.reason)
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
                        _describe(job),
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
                    _describe(job),
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

    def _result(self, result: object) -> dict[str, Reject] | None:
        """What a call returned: ``None`` acks, a ``Reject`` is raised, a batch
        handler's ``{message id: Reject}`` is returned; anything else is a
        ``TypeError`` naming the handler, logged at ERROR the first time."""
        if result is None:
            return None
        if isinstance(result, Reject):
            raise result
        spec = self._spec
        if spec.batched:
            if isinstance(result, dict) and all(isinstance(v, Reject) for v in result.values()):
                return result
            expected = (
                "None (ack all) or a dict of message id -> Reject (reject those, ack the rest)"
            )
        else:
            expected = "None (ack) or a Reject (reject)"
        error = TypeError(
            f"handler {spec.id!r} returned {type(result).__name__}; it must return {expected}"
        )
        if not self._counters.bad_return_logged:
            self._counters.bad_return_logged = True
            logger.error(
                "%s. Each call that returns anything else fails (retried per its retry, "
                "then the broker redelivers the message); logged once per handler",
                error,
            )
        raise error

    def _cut_short(self, job: Job) -> None:
        """A call on ``job`` ended without resolving it: remember it for the
        messages' next deliveries (``give_up_after``)."""
        if self._spec.give_up_after is None:
            return
        apart = job.apart
        for index, message in enumerate(job.messages):
            if apart is None or index not in apart:
                self._unresolved.cut_short(self._spec.id, message)

    def _give_up_unresolved(self, job: Job, limit: int) -> bool:
        """Reject, without a call, the messages of ``job`` whose earlier deliveries
        count ``limit`` calls of this handler that never resolved (see
        :mod:`ackgate._service.unresolved`: those before this process saw the message, when
        the process stopped during each, say, as when handling it kills it; and the
        calls cut short since), so a call would most likely end the same way.
        Returns whether nothing is left to call; otherwise a batch job is left with
        the others only."""
        messages = job.messages
        handler_id = self._spec.id
        count = self._unresolved.count
        apart = job.apart or set()  # resolved at hand-out (decode=, a replay for another)
        stale = {
            index: unresolved
            for index, message in enumerate(messages)
            if index not in apart
            and message.attempt is not None
            and message.attempt > limit
            and (unresolved := count(handler_id, message)) >= limit
        }
        if not stale:
            return False
        for index, unresolved in stale.items():
            logger.warning(
                "handler %r gives up on message id=%s (attempt %s, give_up_after=%d) "
                "without calling it: %d earlier deliveries were never resolved by it (did "
                "the process stop while handling it?); it is dead-lettered once every "
                "handler is done with it",
                handler_id,
                messages[index].id,
                messages[index].attempt,
                limit,
                unresolved,
            )
        self._counters.gave_up += len(stale)
        reasons = {index: _unresolved_reason(unresolved) for index, unresolved in stale.items()}
        if not self._spec.batched:
            job.resolved = True
            self._manager.reject_bound(job.seqs, reason=reasons[0])
            return True
        self._reject_each(job, reasons)
        apart = apart | set(stale)
        if len(apart) == len(messages):
            job.resolved = True
            self._manager.confirm_persisted(job.seqs)  # acks those left apart unrejected
            return True
        job.apart = apart
        job.argument = [message for index, message in enumerate(messages) if index not in apart]
        return False

    def _failed(self, job: Job, exc: BaseException, calls: int) -> None:
        """``job`` failed every call: its messages fail (the broker redelivers them),
        except those at ``attempt >= give_up_after``, which this handler gives up on
        (a reject, with the exception as the reason)."""
        spec = self._spec
        counters = self._counters
        limit = spec.give_up_after
        apart = job.apart
        called = [
            (index, message)
            for index, message in enumerate(job.messages)
            if apart is None or index not in apart
        ]
        given: dict[int, str | None] = {}
        if limit is not None:
            given = {
                index: f"gave up after {message.attempt} attempts: {type(exc).__name__}: {exc}"
                for index, message in called
                if message.attempt is not None and message.attempt >= limit
            }
        job.resolved = True
        if given:
            if spec.batched:
                self._reject_each(job, given)
            else:
                self._manager.reject_bound(job.seqs, reason=given[0])
            counters.gave_up += len(given)
        if len(given) < len(called):
            self._manager.fail_bound(job.seqs)  # the rest: what was rejected stays so
            counters.failed += len(called) - len(given)
        if not given:
            uncounted = limit is not None and any(m.attempt is None for _, m in called)
            logger.warning(
                "handler %r failed on %s after %d call(s); the broker redelivers it%s: %r",
                spec.id,
                _describe(job),
                calls,
                " (give_up_after cannot apply: the producer's messages carry no attempt)"
                if uncounted
                else "",
                exc,
                exc_info=exc,
            )
        elif len(given) == len(called):
            logger.warning(
                "handler %r gave up on %s (give_up_after=%s) after %d call(s); it is "
                "dead-lettered once every handler is done with it: %r",
                spec.id,
                _describe(job),
                limit,
                calls,
                exc,
                exc_info=exc,
            )
        else:
            logger.warning(
                "handler %r failed on %s after %d call(s): gave up on %d of them "
                "(attempt >= give_up_after=%s: ids %s), dead-lettered once every handler "
                "is done with them; the broker redelivers the rest: %r",
                spec.id,
                _describe(job),
                calls,
                len(given),
                limit,
                ", ".join(job.messages[index].id for index in list(given)[:5]),
                exc,
                exc_info=exc,
            )

    def _reject_each(self, job: Job, reasons: Mapping[int, str | None]) -> None:
        """Reject the messages of batch ``job`` at ``reasons``' indexes (into
        ``job.messages``), each with its reason; the others stay bound."""
        assert job.sizes is not None, "batch jobs hold batch bindings"
        start = 0
        for seq, size in zip(job.seqs, job.sizes, strict=True):
            by_reason: dict[str | None, list[int]] = {}
            for index in range(start, start + size):
                if index in reasons:
                    by_reason.setdefault(reasons[index], []).append(index - start)
            for reason, indexes in by_reason.items():
                self._manager.reject_in_batch(seq, indexes, reason)
            start += size

    def _resolve_batch(self, job: Job, rejects: dict[str, Reject]) -> None:
        """A batch handler returned rejects: reject those messages, ack the rest."""
        apart = job.apart
        reasons: dict[int, str | None] = {}
        seen: set[str] = set()
        for index, message in enumerate(job.messages):
            reject = rejects.get(message.id)
            if reject is None or (apart is not None and index in apart):
                continue
            seen.add(message.id)
            reasons[index] = reject.reason
            logger.info(
                "handler %r rejected message id=%s: %s", self._spec.id, message.id, reject.reason
            )
        self._reject_each(job, reasons)
        self._counters.rejected += len(reasons)
        self._manager.confirm_persisted(job.seqs)  # acks the messages not rejected
        self._counters.handled += len(job.argument) - len(reasons)
        unknown = rejects.keys() - seen
        if unknown:
            logger.warning(
                "handler %r returned rejects for %d message id(s) not in its batch, ignored: %s",
                self._spec.id,
                len(unknown),
                ", ".join(sorted(unknown)[:5]),
            )


def _unresolved_reason(deliveries: int) -> str:
    return (
        f"gave up after {deliveries} attempts: not resolved by any of them "
        "(the process stopped or the call was cut short each time)"
    )


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _describe(job: Job) -> str:
    """The job's message ids and delivery attempts for a log line, never their bodies."""
    messages = job.messages
    if len(messages) == 1:
        message = messages[0]
        if message.attempt is None:
            return f"message id={message.id}"
        return f"message id={message.id} (attempt {message.attempt})"
    attempts = [message.attempt for message in messages if message.attempt is not None]
    counted = f", attempts {min(attempts)}-{max(attempts)}" if attempts else ""
    return (
        f"a batch of {len(messages)} messages (ids {messages[0].id} .. {messages[-1].id}{counted})"
    )
