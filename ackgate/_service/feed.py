"""One handler of a :class:`~ackgate.Service`: its subscription to the group, and the
feed that pulls messages, binds their tickets and hands them to its :class:`Calls`.

A session lasts one group life. Within it the handler is subscribed again at once
when the core force-fails it (ack timeout: its calls in progress are cancelled, the
events it owed are failed and redelivered); the session ends when the group does
(its ``StreamTerminated`` is returned to the service, which restarts the group), or
when the service stops it (graceful: calls in progress get until the deadline).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any, NoReturn

from ackgate._contract.errors import AckTimeout, StreamTerminated, SubscriberOverflow
from ackgate._contract.message import (
    REPLAY_SERVICE_HEADER,
    REPLAY_TO_HEADER,
    REPLAYED_HEADER,
    Message,
    Reject,
)
from ackgate._contract.producer import SharedStreamProducer
from ackgate._core.subscription import Subscription
from ackgate._service.calls import UNORDERED, Calls, Job
from ackgate._service.handlers import HandlerCounters, HandlerSpec
from ackgate._service.retry import Redelivery
from ackgate._service.unresolved import UnresolvedCalls

if TYPE_CHECKING:
    from ackgate._core.manager import SharedStreamManager

logger = logging.getLogger("ackgate.service")

#: ``Service.stop()``'s default timeout; also how long a hard stop (``run()``
#: cancelled, e.g. by ``asyncio.run()`` when ``main()`` raised) gives the group's stop.
DEFAULT_STOP_TIMEOUT = 30.0

#: The least the group's stop gets, even after ``stop(0)``: its final advances are
#: what keeps the finished messages from being redelivered.
_MIN_FINAL_STOP = 1.0


#: The ordering key of every batch of a batch handler kept in stream order: a batch
#: waiting out a redelivery backoff holds back the later ones.
_IN_STREAM_ORDER: Hashable = "batches in stream order"


def _ordering_key(spec: HandlerSpec) -> Callable[[Message], Hashable]:
    if spec.batched or spec.ordering == "none":  # batches: see ``_pull_batches``
        return lambda message: UNORDERED
    if spec.ordering == "lane":
        return lambda message: message.lane
    # "key": messages without a key are not ordered among themselves.
    return lambda message: UNORDERED if message.key is None else message.key


def handed_out(spec: HandlerSpec, service: bytes, message: Message) -> Message | Reject | None:
    """What handler ``spec`` of the service keyed ``service`` (``str(key)``, encoded)
    is handed of ``message``: the message itself, or its copy with the decoded
    ``value`` (``decode=``); a ``Reject`` naming the error when the body does not
    decode; ``None`` when it is a replayed copy meant for another handler only (its
    ``ackgate.replay-to`` header) or another service (``ackgate.replay-service``):
    this handler acks it unseen."""
    headers = message.headers
    if REPLAYED_HEADER in headers:
        target = headers.get(REPLAY_TO_HEADER)
        if target is not None and target != spec.id.encode():
            return None
        target = headers.get(REPLAY_SERVICE_HEADER)
        if target is not None and target != service:
            return None
    decoder = spec.decoder
    if decoder is None:
        return message
    try:
        return decoder.decoded(message)
    except Reject as reject:
        return reject


class HandlerWorker:
    """Runs one handler's sessions. Caller: the service, one session at a time."""

    def __init__(
        self,
        spec: HandlerSpec,
        *,
        key: Hashable,
        manager: SharedStreamManager,
        factory: Callable[[], SharedStreamProducer],
        roster: tuple[str, ...],
        counters: HandlerCounters,
        on_exit: Callable[[BaseException], None],
        unresolved: UnresolvedCalls,
        invoke: Callable[[Job], Awaitable[Any]] | None = None,
        redelivery: Redelivery | None = None,
    ) -> None:
        self.spec = spec
        self._redelivery = redelivery
        self._unresolved = unresolved
        self._invoke = invoke
        self._key = key
        #: What an ``ackgate.replay-service`` header names to mean this service.
        self._service = str(key).encode()
        self._manager = manager
        self._factory = factory
        self._roster = roster
        self._counters = counters
        self._on_exit = on_exit
        self._order_by = _ordering_key(spec)
        #: Loop time by which a graceful stop ends the calls; ``None`` until stopped.
        self._stop_at: float | None = None
        #: Seconds the group's stop (final advances, closing the producer) gets once
        #: this handler left it last: the stop's timeout, else ``stop()``'s default.
        self._stop_timeout = DEFAULT_STOP_TIMEOUT
        #: The running feed and its calls. Invariant: set only while a session awaits it.
        self._feed: asyncio.Task[NoReturn] | None = None
        self._calls: Calls | None = None
        self._subscription: Subscription | None = None

    def stop(self, deadline: float, timeout: float) -> None:
        """Graceful stop: from now on nothing new is handed to the handler (jobs not
        started fail at once); calls in progress get until ``deadline`` (loop time),
        the group's stop ``timeout`` seconds more."""
        self._stop_at = deadline
        self._stop_timeout = timeout
        if self._subscription is not None:
            # First: what the group would receive from now on reaches no handler.
            self._subscription._group.stop_polling()
        if self._calls is not None:
            self._calls.close()
        if self._feed is not None:
            self._feed.cancel()

    async def session(self) -> StreamTerminated | None:
        """Serve until the group ends (return its error) or :meth:`stop` (return None).

        Leaves the subscription on every exit, its tickets all resolved. Cancellation:
        calls in progress are cancelled (their events fail), the subscription is left,
        and the cancellation propagates.
        """
        loop = asyncio.get_running_loop()
        while self._stop_at is None:
            subscription = self._manager.subscribe(
                self._key, self.spec.id, producer=self._factory, roster=self._roster
            )
            self._counters.subscribed(subscription)
            self._subscription = subscription
            calls = self._calls = Calls(
                self.spec,
                self._manager,
                self._counters,
                self._on_exit,
                self._unresolved,
                self._invoke,
                self._redelivery,
            )
            pull = self._pull_batches if self.spec.batched else self._pull_each
            feed = self._feed = loop.create_task(pull(subscription, calls))
            # The feed learns of a force-fail at its next pull; a feed waiting for
            # room (every slot busy, perhaps hung) learns of it from this watch.
            watch = loop.create_task(subscription.wait_failed())
            try:
                await asyncio.wait((feed, watch), return_when=asyncio.FIRST_COMPLETED)
                error = _why_ended(feed, watch)
                if error is None:  # stop() cancelled the feed
                    assert self._stop_at is not None
                    await calls.finish(self._stop_at)
                    return None
                if isinstance(error, StreamTerminated):
                    return error
                if not isinstance(error, AckTimeout | SubscriberOverflow):
                    raise error
                logger.warning(
                    "handler %r was force-failed (%s); its calls in progress are "
                    "cancelled and what it owed is redelivered; subscribing again",
                    self.spec.id,
                    type(error).__name__,
                )
            finally:
                feed.cancel()
                watch.cancel()
                self._feed = self._calls = self._subscription = None
                await calls.abort()
                await self._leave(subscription)
        return None

    async def _leave(self, subscription: Subscription) -> None:
        """Leave the group; if it stops with this, wait for that at most the stop
        timeout, then cut its stop short: the advances in flight are cancelled (their
        events are redelivered) and the producer is closed. Whatever awaits it, a
        stop never outlives its timeout by more than the producer's close."""
        try:
            async with asyncio.timeout(max(self._stop_timeout, _MIN_FINAL_STOP)):
                await subscription.aclose()
        except TimeoutError:
            stop = subscription._group.stop_task
            assert stop is not None, "only a group's stop outlasts aclose()"
            logger.error(
                "service %r: the group's stop (its final advances, closing the producer) "
                "took longer than %gs; cut short: what it did not advance is redelivered",
                self._key,
                max(self._stop_timeout, _MIN_FINAL_STOP),
            )
            stop.cancel()
            await asyncio.gather(stop, return_exceptions=True)

    async def _pull_each(self, subscription: Subscription, calls: Calls) -> NoReturn:
        """Per-message handlers: one job per message, ordered by the handler's ordering.
        Pulls as many messages at once as there is room for (one await for them all)."""
        order_by = self._order_by
        spec = self.spec
        service = self._service
        plain = spec.decoder is None
        while True:
            room = calls.capacity - calls.active
            if room <= 0:
                await calls.wait_room()
                continue
            for message, seq in await subscription.pull_bound(room):
                handed = (  # the common case without a call: no decode=, not a replay
                    message
                    if plain and REPLAYED_HEADER not in message.headers
                    else handed_out(spec, service, message)
                )
                if isinstance(handed, Message):
                    calls.submit(Job(handed, (handed,), (seq,), order_by(handed)))
                elif handed is None:
                    self._manager.confirm_persisted((seq,))
                else:
                    self._reject_undecoded(handed, message)
                    self._manager.reject_bound((seq,), reason=handed.reason)

    async def _pull_batches(self, subscription: Subscription, calls: Calls) -> NoReturn:
        """Batch handlers: up to ``batch_size`` messages, ``batch_wait`` after the first.
        Each pull binds one ticket to all the messages it hands out."""
        size = self.spec.batch_size
        wait = self.spec.batch_wait
        batch_key = UNORDERED if self.spec.ordering == "none" else _IN_STREAM_ORDER
        loop = asyncio.get_running_loop()
        while True:
            if calls.active >= calls.capacity:
                await calls.wait_room()
            first = await subscription.pull_batch(size)
            messages = first.events  # a list of its own: extended in place
            seqs = [first.seq]
            sizes = [len(messages)]
            try:
                deadline = loop.time() + wait
                while len(messages) < size:
                    try:
                        async with asyncio.timeout_at(deadline):
                            more = await subscription.pull_batch(size - len(messages))
                    except TimeoutError:
                        break
                    messages.extend(more.events)
                    seqs.append(more.seq)
                    sizes.append(len(more.events))
            except BaseException:
                self._manager.fail_bound(seqs)  # never handed out
                raise
            job = self._batch_job(messages, seqs, sizes, batch_key)
            if job is None:
                self._manager.confirm_persisted(seqs)  # what was not rejected: unseen
            else:
                calls.submit(job)

    def _batch_job(
        self, messages: list[Message], seqs: list[int], sizes: list[int], key: Hashable
    ) -> Job | None:
        """The batch job of ``messages`` as :func:`handed_out` makes them: the ones that
        do not decode are rejected now, those meant for another handler are left
        bound (acked with the batch), both kept out of the call (``Job.apart``).
        ``None``: nothing is left to call."""
        spec = self.spec
        if spec.decoder is None and not any(REPLAYED_HEADER in m.headers for m in messages):
            return Job(messages, messages, seqs, key, sizes)
        apart: set[int] = set()
        rejects: dict[int, str | None] = {}
        handed_messages: list[Message] = []
        for index, message in enumerate(messages):
            handed = handed_out(spec, self._service, message)
            if isinstance(handed, Message):
                handed_messages.append(handed)
                continue
            handed_messages.append(message)
            apart.add(index)
            if handed is not None:
                self._reject_undecoded(handed, message)
                rejects[index] = handed.reason
        start = 0
        for seq, size in zip(seqs, sizes, strict=True):
            indexes = [index - start for index in range(start, start + size) if index in rejects]
            for index in indexes:
                self._manager.reject_in_batch(seq, (index,), rejects[start + index])
            start += size
        if len(apart) == len(messages):
            return None
        argument = [m for index, m in enumerate(handed_messages) if index not in apart]
        job = Job(argument, handed_messages, seqs, key, sizes)
        job.apart = apart or None
        return job

    def _reject_undecoded(self, reject: Reject, message: Message) -> None:
        self._counters.rejected += 1
        logger.info(
            "handler %r rejected message id=%s: %s", self.spec.id, message.id, reject.reason
        )


def _why_ended(
    feed: asyncio.Task[NoReturn], watch: asyncio.Task[Exception]
) -> BaseException | None:
    """What ended a session's feed: the subscription's failure, the feed's own
    exception, or ``None`` when the feed was cancelled (by ``stop()``)."""
    if watch.done():
        return watch.result()
    if feed.cancelled():
        return None
    return feed.exception()
