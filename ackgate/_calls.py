"""The calls of one handler on one subscription: bounded, ordered, retried, resolved.

The subscription's feed pulls a message (or a batch), binds one ticket per message
and :meth:`Calls.submit` s a :class:`Job`; it pulls again once
:attr:`Calls.held` is below :attr:`Calls.capacity`. A job runs as soon as a call
slot is free (at most ``concurrency`` calls at once) and no earlier job with the
same ordering key is still running or waiting. Its call is retried per the
handler's :class:`~ackgate.Retry`; then its tickets are resolved exactly once:
``confirm_persisted`` (the call returned), ``reject_bound`` (``Reject``) or
``fail_bound`` (it failed every attempt, or was cancelled). Stopping drops the
jobs that have not started (their tickets fail: the broker redelivers them).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from ackgate._handlers import HandlerCounters, HandlerSpec
from ackgate._message import Message, Reject

if TYPE_CHECKING:
    from ackgate._manager import SharedStreamManager

logger = logging.getLogger("ackgate.service")

#: Per-message handlers hold at least this many jobs: the feed then pulls them in one
#: step and a slot runs them back to back, instead of a feed wake-up per message.
_MIN_HELD_MESSAGES = 32

#: The ordering key of a job that waits for no other job.
UNORDERED: Any = object()


class Job:
    """One handler call to make: its argument, its messages and their tickets."""

    __slots__ = ("argument", "key", "messages", "resolved", "seqs", "sizes")

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
        invoke: Callable[[Job], Awaitable[Any]] | None = None,
    ) -> None:
        self._spec = spec
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
        retry = spec.retry
        counters = self._counters
        invoke = self._invoke
        attempt = 1
        while True:
            try:
                result = await (spec.function(job.argument) if invoke is None else invoke(job))
                rejects = _batch_rejects(spec, result) if spec.batched else None
            except Reject as reject:
                job.resolved = True
                self._manager.reject_bound(job.seqs, reason=reject.reason)
                counters.rejected += len(job.messages)
                logger.info("handler %r rejected %s: %s", spec.id, _describe(job), reject.reason)
                return
            except Exception as exc:
                if attempt < retry.attempts:
                    delay = retry.delay(attempt)
                    logger.warning(
                        "handler %r failed on %s (attempt %d of %d), retrying in %.3gs: %r",
                        spec.id,
                        _describe(job),
                        attempt,
                        retry.attempts,
                        delay,
                        exc,
                    )
                    counters.retried += len(job.messages)
                    attempt += 1
                    await asyncio.sleep(delay)
                    continue
                job.resolved = True
                self._manager.fail_bound(job.seqs)
                counters.failed += len(job.messages)
                logger.warning(
                    "handler %r failed on %s after %d attempt(s); the broker redelivers it: %r",
                    spec.id,
                    _describe(job),
                    attempt,
                    exc,
                    exc_info=exc,
                )
                return
            job.resolved = True
            if rejects:
                self._resolve_batch(job, rejects)
            else:
                self._confirm(job.seqs)
                counters.handled += len(job.messages)
            return

    def _resolve_batch(self, job: Job, rejects: dict[str, Reject]) -> None:
        """A batch handler returned rejects: reject those messages, ack the rest."""
        assert job.sizes is not None, "batch jobs hold batch bindings"
        seen: set[str] = set()
        messages = job.messages
        start = 0
        for seq, size in zip(job.seqs, job.sizes, strict=True):
            by_reason: dict[str | None, list[int]] = {}
            for index in range(size):
                message = messages[start + index]
                reject = rejects.get(message.id)
                if reject is None:
                    continue
                seen.add(message.id)
                by_reason.setdefault(reject.reason, []).append(index)
                logger.info(
                    "handler %r rejected message id=%s: %s",
                    self._spec.id,
                    message.id,
                    reject.reason,
                )
            for reason, indexes in by_reason.items():
                self._manager.reject_in_batch(seq, indexes, reason)
                self._counters.rejected += len(indexes)
            start += size
        self._manager.confirm_persisted(job.seqs)  # acks the messages not rejected
        self._counters.handled += len(messages) - sum(
            1 for message in messages if message.id in seen
        )
        unknown = rejects.keys() - seen
        if unknown:
            logger.warning(
                "handler %r returned rejects for %d message id(s) not in its batch, ignored: %s",
                self._spec.id,
                len(unknown),
                ", ".join(sorted(unknown)[:5]),
            )


def _batch_rejects(spec: HandlerSpec, result: object) -> dict[str, Reject] | None:
    """A batch handler's result: ``None`` (ack all) or ``{message id: Reject}``."""
    if result is None:
        return None
    if isinstance(result, dict) and all(isinstance(v, Reject) for v in result.values()):
        return result
    raise TypeError(
        f"batch handler {spec.id!r} returned {type(result).__name__}; return None (ack all) "
        "or a dict of message id -> Reject (reject those, ack the rest)"
    )


def _describe(job: Job) -> str:
    """The job's message ids for a log line, never their bodies."""
    messages = job.messages
    if len(messages) == 1:
        return f"message id={messages[0].id}"
    return f"a batch of {len(messages)} messages (ids {messages[0].id} .. {messages[-1].id})"
