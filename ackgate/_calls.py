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
import logging
from collections import deque
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from ackgate._handlers import HandlerCounters, HandlerSpec
from ackgate._message import Message, Reject

if TYPE_CHECKING:
    from ackgate._manager import SharedStreamManager

logger = logging.getLogger("ackgate.service")

#: The ordering key of a job that waits for no other job.
UNORDERED: Any = object()


class Job:
    """One handler call to make: its argument, its messages and their tickets."""

    __slots__ = ("argument", "key", "messages", "resolved", "seqs", "task")

    def __init__(
        self, argument: Any, messages: Sequence[Message], seqs: Sequence[int], key: Hashable
    ) -> None:
        #: What the handler is called with: a Message, or a list of them (batches).
        self.argument = argument
        self.messages = messages
        #: One ticket per message, in the same order.
        self.seqs = seqs
        #: Jobs with an equal key run one at a time, in submission order.
        self.key = key
        #: Set once the tickets were resolved. Invariant: they are resolved exactly once.
        self.resolved = False
        self.task: asyncio.Task[None] | None = None


class Calls:
    """The jobs of one handler's subscription, from submission to resolution."""

    def __init__(
        self, spec: HandlerSpec, manager: SharedStreamManager, counters: HandlerCounters
    ) -> None:
        self._spec = spec
        self._manager = manager
        self._counters = counters
        self._concurrency = spec.concurrency
        #: How many jobs the feed may hold before it waits: ordered per-message handlers
        #: hold twice their concurrency, so a busy key does not idle every slot; batch
        #: handlers fill their next batch while ``concurrency`` batches run.
        if spec.batched:
            self.capacity = spec.concurrency + 1
        elif spec.ordering == "none":
            self.capacity = spec.concurrency
        else:
            self.capacity = 2 * spec.concurrency
        #: Jobs submitted and not finished. Invariant: ``held == len(_running) +
        #: len(_ready) + sum(map(len, _behind.values()))``.
        self.held = 0
        #: Running calls. Invariant: ``len(_running) <= concurrency``.
        self._running: set[asyncio.Task[None]] = set()
        #: Jobs free to start (no earlier job of their key left), waiting for a slot.
        self._ready: deque[Job] = deque()
        #: Per ordering key with a job running or ready: the jobs waiting behind it.
        self._behind: dict[Hashable, deque[Job]] = {}
        self._room: asyncio.Future[None] | None = None
        #: Set by :meth:`finish` / :meth:`abort`: no job starts any more.
        self._closed = False

    # -- feeding ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Take ``job``: start it now if its key and a slot are free, else queue it."""
        self.held += 1
        key = job.key
        if key is not UNORDERED:
            behind = self._behind.get(key)
            if behind is not None:
                behind.append(job)
                return
            self._behind[key] = deque()
        if len(self._running) < self._concurrency and not self._closed:
            self._start(job)
        else:
            self._ready.append(job)

    async def wait_room(self) -> None:
        """Wait until ``held < capacity``. Cancellation: nothing changes."""
        while self.held >= self.capacity:
            room = self._room = asyncio.get_running_loop().create_future()
            try:
                await room
            finally:
                self._room = None

    # -- stopping -----------------------------------------------------------------

    async def finish(self, deadline: float) -> None:
        """Start nothing more; give running calls until ``deadline`` (loop time), then
        cancel the rest. Jobs not started fail at once. Cancellation: every call is
        cancelled (its tickets fail) and this returns without waiting for them."""
        self._closed = True
        self._drop_waiting()
        try:
            if self._running:
                timeout = max(0.0, deadline - asyncio.get_running_loop().time())
                await asyncio.wait(set(self._running), timeout=timeout)
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Start nothing more, cancel every call, fail every ticket not resolved yet.

        Returns once the cancelled calls have ended. Idempotent. Cancellation: the
        calls are cancelled already; this stops waiting for them.
        """
        self._closed = True
        self._drop_waiting()
        running = list(self._running)
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

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

    def _start(self, job: Job) -> None:
        task = job.task = asyncio.get_running_loop().create_task(self._call(job))
        self._running.add(task)

    async def _call(self, job: Job) -> None:
        counters = self._counters
        size = len(job.seqs)
        counters.in_progress += size
        try:
            await self._attempts(job)
        finally:
            counters.in_progress -= size
            if not job.resolved:  # cancelled, or a BaseException from the handler
                job.resolved = True
                self._manager.fail_bound(job.seqs)
            assert job.task is not None
            self._running.discard(job.task)
            self._finished(job)

    def _finished(self, job: Job) -> None:
        self.held -= 1
        key = job.key
        if key is not UNORDERED:
            behind = self._behind.get(key)
            if behind:
                self._ready.append(behind.popleft())  # the key stays taken
            else:
                self._behind.pop(key, None)
        if not self._closed:
            ready = self._ready
            while ready and len(self._running) < self._concurrency:
                self._start(ready.popleft())
        room = self._room
        if room is not None and self.held < self.capacity and not room.done():
            room.set_result(None)

    async def _attempts(self, job: Job) -> None:
        spec = self._spec
        retry = spec.retry
        counters = self._counters
        attempt = 1
        while True:
            try:
                result = await spec.function(job.argument)
                rejects = _batch_rejects(spec, result) if spec.batched else None
            except Reject as reject:
                job.resolved = True
                self._manager.reject_bound(job.seqs, reason=reject.reason)
                counters.rejected += len(job.seqs)
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
                    counters.retried += len(job.seqs)
                    attempt += 1
                    await asyncio.sleep(delay)
                    continue
                job.resolved = True
                self._manager.fail_bound(job.seqs)
                counters.failed += len(job.seqs)
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
                self._manager.confirm_persisted(job.seqs)
                counters.handled += len(job.seqs)
            return

    def _resolve_batch(self, job: Job, rejects: dict[str, Reject]) -> None:
        acked: list[int] = []
        seen: set[str] = set()
        for message, seq in zip(job.messages, job.seqs, strict=True):
            reject = rejects.get(message.id)
            if reject is None:
                acked.append(seq)
                continue
            seen.add(message.id)
            self._manager.reject_bound((seq,), reason=reject.reason)
            logger.info(
                "handler %r rejected message id=%s: %s", self._spec.id, message.id, reject.reason
            )
        self._manager.confirm_persisted(acked)
        self._counters.handled += len(acked)
        self._counters.rejected += len(job.seqs) - len(acked)
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
