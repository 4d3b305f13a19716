"""``Service``: decorated handlers over one shared stream, kept up by supervision.

A service is a user of the core's public API: its handlers are the roster
(docs/concepts.md#snapshot-and-roster) of one ack-mode group, each handler one subscription
(:mod:`ackgate._service.feed`) whose calls run concurrently, in order per lane or key
(:mod:`ackgate._service.calls`), and resolve the tickets bound to their messages
(docs/concepts.md#deferred-resolution). The producer is wrapped so each event is converted to a
:class:`~ackgate.Message` once (:mod:`ackgate._service.convert`).

Lifecycle: *new* (handlers may be registered) → *running* (``run()``) → *stopped*.
While running, a group that ends (upstream failure, advance failure) is restarted
after an exponential backoff; ``stop()`` ends the running. Two ends are final:
the producer factory raising (a configuration error, which no restart mends), and
``restart_limit`` restarts in a row with nothing advanced: ``run()`` raises.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Hashable
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from ackgate._contract.checks import check_int, check_number
from ackgate._contract.errors import PermanentError, StreamTerminated
from ackgate._contract.message import Message
from ackgate._contract.producer import SharedStreamProducer
from ackgate._contract.stats import OldestOutstanding
from ackgate._core.manager import SharedStreamManager
from ackgate._service.convert import Converting, DeadLetterMissing, MessageProducer
from ackgate._service.decode import check_decoder
from ackgate._service.feed import DEFAULT_STOP_TIMEOUT, HandlerWorker
from ackgate._service.handlers import (
    HandlerCounters,
    HandlerSpec,
    OldestMessage,
    Ordering,
    ServiceStats,
    check_spec,
)
from ackgate._service.refusals import Refusals, refusal_in
from ackgate._service.retry import Redelivery, Retry
from ackgate._service.telemetry import ServiceTelemetry, for_service
from ackgate._service.unresolved import UnresolvedCalls

logger = logging.getLogger("ackgate.service")

F = TypeVar("F", bound=Callable[..., Any])

#: ``handler(decode=...)`` not given: the service's ``decode=`` applies.
_SERVICE_DECODE: Any = object()


class Service:
    """Handlers that each see every message of one stream; the broker advanced only
    once all of them acked or rejected it.

    ``key`` names the service's group (in logs and stats): any hashable but
    ``None``; a ``str`` or ``bytes`` key must not be empty or blank, and a ``str``
    must be printable (no newline), else ``ValueError``.
    ``producer`` is a zero-argument factory returning a :class:`SharedStreamProducer`
    (called once per group life, so again after each restart). ``options`` are
    :class:`SharedStreamManager` arguments, used when the service makes its own
    manager (``manager=None``; it is closed when ``run()`` returns); with
    ``manager=`` they must be empty. After the group ends, it is started again
    after ``restart_backoff`` seconds, doubling per consecutive restart up to
    ``max_restart_backoff`` (back to ``restart_backoff`` once a handler finished a
    message in the meantime). ``redelivery`` is the :class:`~ackgate.Redelivery`
    backoff of every handler without its own: how long a message a handler failed
    waits before it is handed to that handler again.
    ``decode=`` is every handler's ``decode=`` unless the handler passes its own
    (see :meth:`handler`).

    Supervision gives up in three cases, and ``run()`` raises. A producer raising
    :class:`~ackgate.PermanentError` (a refusal the broker repeats for good) stops it:
    ``run()`` raises that error. An exception raised by
    the ``producer`` factory itself (or a factory returning something that is not a
    producer) is a configuration error: it is never retried, and ``run()`` raises
    that very exception. With ``restart_limit=N`` (default ``None``: no limit),
    ``run()`` raises the group's last error (``StreamTerminated``, or
    ``AdvanceFailed``; the broker's error is its ``__cause__``) when the group ended
    again after N restarts in a row without advancing a single message; ``0``
    never restarts. Either exception carries a note (``__notes__``) naming the
    service and why it was not restarted.

    Two permanent errors say the broker refused the producer itself:
    :class:`~ackgate.AuthenticationFailed` (credentials refused, access denied) and
    :class:`~ackgate.TLSVerificationFailed`. With ``retry_on_auth_error=SECONDS``
    (credentials being rotated) the group is started again every ``SECONDS`` instead,
    outside ``restart_limit``: the refusal is logged once at WARNING (again only if
    its reason changes) and shown in ``ServiceStats.refused``.
    """

    def __init__(
        self,
        key: Hashable,
        *,
        producer: Callable[[], SharedStreamProducer],
        manager: SharedStreamManager | None = None,
        restart_backoff: float = 1.0,
        max_restart_backoff: float = 60.0,
        restart_limit: int | None = None,
        retry_on_auth_error: float | None = None,
        decode: object = None,
        redelivery: Redelivery = Redelivery(),  # noqa: B008 - immutable
        **options: Any,
    ) -> None:
        if key is None:
            raise ValueError("key must not be None")
        try:
            hash(key)
        except TypeError:
            raise ValueError(f"key must be hashable, got {type(key).__name__}") from None
        # The key names the service in every log line and in stats: it must say something.
        if isinstance(key, str | bytes) and not key.strip():
            raise ValueError(f"key must not be empty or blank, got {key!r}")
        if isinstance(key, str) and not key.isprintable():
            raise ValueError(
                f"key must be printable (no newline or control character), got {key!r}"
            )
        if isinstance(producer, SharedStreamProducer) or not callable(producer):
            raise TypeError(
                "producer must be a zero-argument factory returning a SharedStreamProducer "
                f"(it is called again on every restart), got {producer!r}"
            )
        for name, value in (
            ("restart_backoff", restart_backoff),
            ("max_restart_backoff", max_restart_backoff),
        ):
            check_number(name, value, minimum=0)
        if max_restart_backoff < restart_backoff:
            raise ValueError(
                f"max_restart_backoff ({max_restart_backoff!r}) must be >= "
                f"restart_backoff ({restart_backoff!r})"
            )
        _check_restart_limit(restart_limit)
        check_decoder(f"service {key!r}", decode)
        if not isinstance(redelivery, Redelivery):
            raise TypeError(f"redelivery must be a Redelivery, got {redelivery!r}")
        if manager is not None and options:
            raise ValueError(
                f"manager options {sorted(options)} apply only to the service's own manager; "
                "configure the manager you pass instead"
            )
        self.key = key
        self._manager = SharedStreamManager(**options) if manager is None else manager
        self._owns_manager = manager is None
        #: What this process saw of each message's deliveries (``give_up_after``).
        self._unresolved = UnresolvedCalls()
        self._factory = Converting(
            producer, self._giving_up, self._unresolved.seen, made=self._producer_made
        )
        self._restart_backoff = float(restart_backoff)
        self._max_restart_backoff = float(max_restart_backoff)
        self._restart_limit = restart_limit
        self._refusals = Refusals(key, retry_on_auth_error)
        #: Every handler's ``decode=`` unless it passes its own.
        self._decode = decode
        self._redelivery = redelivery
        self._specs: dict[str, HandlerSpec] = {}
        self._counters: dict[str, HandlerCounters] = {}
        self._workers: list[HandlerWorker] = []
        self._state: Literal["new", "running", "stopped"] = "new"
        self._restarts = 0
        #: OpenTelemetry instrumentation, decided when ``run()`` starts (None: no SDK).
        self._telemetry: ServiceTelemetry | None = None
        #: Loop time by which a graceful stop ends calls; set once by :meth:`stop`.
        self._stop_at: float | None = None
        #: Set by :meth:`stop`: cuts a restart backoff short.
        self._stopping: asyncio.Event | None = None
        #: Resolved when ``run()`` has returned (or raised).
        self._finished: asyncio.Future[None] | None = None
        #: The first KeyboardInterrupt or SystemExit a handler raised: the service
        #: stops, then ``run()`` raises it.
        self._exit: BaseException | None = None

    def __repr__(self) -> str:
        return f"<Service key={self.key!r} handlers={list(self._specs)} state={self._state}>"

    # -- registering ---------------------------------------------------------------

    def handler(
        self,
        handler_id: str,
        *,
        concurrency: int = 1,
        ordering: Ordering = "lane",
        retry: Retry = Retry(),  # noqa: B008 - immutable
        batch_size: int = 1,
        batch_wait: float = 0.0,
        give_up_after: int | None = None,
        decode: object = _SERVICE_DECODE,
        redelivery: Redelivery | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated ``async def`` as handler ``handler_id``; return it unchanged.

        A per-message handler (``batch_size=1``) is called with one
        :class:`~ackgate.Message`: returning acks it, ``raise Reject(reason)``
        rejects it (dead-lettered, never retried), any other exception is retried
        per ``retry``; then the message is handed to *this handler* again after its
        redelivery backoff (``redelivery``, else the service's: 1 s doubling to 60 s,
        jittered), in-process: the handlers that acked it never see it again, and
        only what ``ordering`` ties to it waits for this handler (its key, its lane,
        or nothing). A hand-out that would come past half the manager's
        ``ack_timeout`` after the message reached the handler is not waited for: the
        message fails for this handler and the broker redelivers it (with a fresh
        ack timeout). Retries, their backoffs included, count against
        ``ack_timeout``: a message not resolved by then fails for this handler, its
        calls in progress are cancelled and it is subscribed again (the broker
        redelivers).
        At most ``concurrency`` calls run at once; ``ordering`` is ``"lane"`` (one
        at a time per ``Message.lane``, in stream order), ``"key"`` (one at a time
        per ``Message.key``; messages without a key are not ordered) or ``"none"``.

        A batch handler (``batch_size > 1``) is called with a list of up to
        ``batch_size`` messages in stream order, at the latest ``batch_wait``
        seconds after the first of them arrived. Returning ``None`` acks all;
        returning ``{message.id: Reject(reason)}`` rejects those and acks the rest;
        ``raise Reject`` rejects all; another exception retries the batch, then
        fails all. ``concurrency`` counts batch calls (more than one needs
        ``ordering="none"``).

        ``give_up_after`` (an ``int >= 1``, default ``None``: never) stops a poison
        message from coming back forever. When the handler fails a message (after
        every ``retry`` call) whose :attr:`Message.attempt` is ``>= give_up_after``,
        the failure becomes a reject for this handler, with the reason ``"gave up
        after N attempts: ExcType: message"``: a handler failing a message every
        time is handed it exactly N times. ``attempt`` is this handler's own count
        (:mod:`ackgate._service.unresolved`). The message is dead-lettered once
        every handler is done with it, and the stream moves on. A handler that
        kills its process on a message, or hangs on it, never *fails* it; so a
        message is also rejected without calling the handler when its earlier
        deliveries count ``give_up_after`` calls of this handler that never
        resolved, with the reason ``"gave up after N attempts: not resolved by any
        of them (...)"``. Deliveries made before this process first saw the message
        count so (the process may have stopped during each: a crash loop);
        deliveries since count only when this handler's call on it was cut short
        (ack timeout, stop, restart), not when the message merely waited in a
        queue. Both are logged at WARNING and counted in ``HandlerStats.gave_up``.
        Another handler's failure never counts. For a batch handler each message
        of a failed batch is judged by its own ``attempt``: those at
        ``give_up_after`` or more are given up, the rest are handed again (a smaller
        batch); messages given up without a call are left out of the call. A service with
        ``give_up_after`` on any handler refuses to start (``run()`` raises
        ``ValueError``) when the producer has no dead-letter destination
        (:meth:`SharedStreamProducer.dead_letter_destination` is ``None``): giving
        up never drops a message.

        ``decode=`` (default: the service's) types the payload: a callable taking
        the body (``bytes``), a pydantic v2 model class or a msgspec ``Struct``
        class (JSON bodies; ``pip install 'ackgate[pydantic]'`` or
        ``'ackgate[msgspec]'``). The handler is handed a copy of each message whose
        ``value`` is the decoded body (annotate ``Message[Order]``); ``decode=None``
        hands the bytes only. A body that does not decode is rejected for this
        handler, with a reason naming the error (dead-lettered, never retried,
        never handed to it). Handlers given the same decoder decode each message
        once. A parameter annotated as a list of messages without ``batch_size``, or
        as one ``Message`` with it, is a ``TypeError`` at decoration.

        Ids are unique (``ValueError``); registering once ``run()`` started is a
        ``RuntimeError``. Invalid options are a ``ValueError`` (``TypeError`` for a
        function that is not ``async def``, or ``retry`` not a ``Retry``).

        Mistakes are never silent:

        * ``@service.handler`` without parentheses is a ``TypeError`` at once: the
          id names the handler in the roster (every message waits for it), so it
          is never guessed from the function's name, which a refactor may change.
        * A function that cannot be called with one positional argument (``async
          def h()``, ``async def h(message, context)``) is a ``TypeError`` at
          decoration, naming its signature.
        * Returning a ``Reject`` is the same as raising it. Returning anything else
          (other than ``None``, or a batch handler's dict) fails the call with a
          ``TypeError`` naming the handler, logged at ERROR the first time; the
          call is retried per ``retry``, then the message is redelivered.
        * A ``CancelledError`` the handler's own code raises (a future it awaited
          was cancelled) is a failure of that call like any other; only a stop, an
          ack timeout or the event loop's teardown cancels a call.
        * ``KeyboardInterrupt`` or ``SystemExit`` (``sys.exit()``) raised in a
          handler fails that call's messages (they are redelivered), stops the
          service gracefully (as ``stop()`` with its default timeout), then
          ``run()`` raises it, so the process exits (with ``SystemExit``'s code).
        """
        if callable(handler_id):
            # ``@service.handler`` without parentheses. The id is a roster member's
            # name: messages wait for it and brokers' commit state may be kept under
            # it, so it is never guessed from a function name a refactor may change.
            raise TypeError(
                "@service.handler needs a handler id: write "
                f"@service.handler({getattr(handler_id, '__name__', 'my_handler')!r}) above "
                f"{handler_id!r}, with an id that stays the same across deploys"
            )

        def register(function: F) -> F:
            if self._state != "new":
                raise RuntimeError(
                    f"handler {handler_id!r}: handlers are registered before run() starts"
                )
            if handler_id in self._specs:
                raise ValueError(f"handler id {handler_id!r} is already registered")
            spec = check_spec(
                handler_id,
                function,
                concurrency=concurrency,
                ordering=ordering,
                retry=retry,
                batch_size=batch_size,
                batch_wait=batch_wait,
                give_up_after=give_up_after,
                decode=self._decode if decode is _SERVICE_DECODE else decode,
                redelivery=redelivery,
            )
            self._specs[spec.id] = spec
            self._counters[spec.id] = HandlerCounters()
            return function

        return register

    def _giving_up(self) -> dict[str, int]:
        return {
            spec.id: spec.give_up_after
            for spec in self._specs.values()
            if spec.give_up_after is not None
        }

    # -- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Run the handlers until :meth:`stop` (or cancellation); then return.

        ``ValueError`` without handlers; ``RuntimeError`` if called twice;
        ``ValueError`` when the first producer is made, if a handler sets
        ``give_up_after`` and the producer has no dead-letter destination (never
        retried: every producer from that factory would be refused). When the
        group ends it is logged and started again after the restart backoff; a
        handler force-failed by the ack timeout is subscribed again at once. It
        raises instead when the producer factory raised (that exception) or
        ``restart_limit`` was reached (the group's last ``StreamTerminated``), with
        the handlers' calls in progress cancelled: the group has ended, so nothing
        more could be advanced. See the class docstring.

        Cancellation is a hard stop: calls in progress are cancelled (their events
        fail and are redelivered), what was already resolved is advanced, the
        producer is closed, then ``CancelledError`` propagates. The group's stop
        (final advances, closing the producer) gets the timeout of a ``stop()``
        called before, else 30 s; past it, the advances still in flight are
        cancelled (their events are redelivered). So when ``asyncio.run(main())``
        tears down because ``main()`` raised, the teardown ends in bounded time and
        ``main()``'s exception is the one that propagates.

        A ``KeyboardInterrupt`` or ``SystemExit`` raised by a handler stops the
        service gracefully, then propagates from here.
        """
        if not self._specs:
            raise ValueError(f"service {self.key!r} has no handler: register one with @handler")
        if self._state != "new":
            raise RuntimeError(f"service {self.key!r}: run() may be called once")
        self._state = "running"
        self._stopping = asyncio.Event()
        self._finished = asyncio.get_running_loop().create_future()
        roster = tuple(self._specs)
        telemetry = self._telemetry = for_service(self)
        self._workers = [
            HandlerWorker(
                spec,
                key=self.key,
                manager=self._manager,
                factory=self._factory,
                roster=roster,
                counters=self._counters[spec.id],
                on_exit=self._handler_exited,
                unresolved=self._unresolved,
                invoke=None if telemetry is None else telemetry.handler(spec),
                redelivery=self._redelivery,
            )
            for spec in self._specs.values()
        ]
        if self._stop_at is not None:  # stop() came first
            self._stopping.set()
        try:
            await self._supervise()
        finally:
            self._state = "stopped"
            try:
                if self._owns_manager:
                    await self._manager.aclose()
            finally:
                self._finished.set_result(None)
        if self._exit is not None:
            raise self._exit

    def _handler_exited(self, exit_: BaseException) -> None:
        """Caller: a handler call that raised KeyboardInterrupt or SystemExit."""
        if self._exit is None:
            self._exit = exit_
        self._request_stop(DEFAULT_STOP_TIMEOUT)

    def _producer_made(self, wrapper: MessageProducer, inner: SharedStreamProducer) -> None:
        if self._telemetry is not None:
            self._telemetry.producer_made(wrapper, inner)

    async def _supervise(self) -> None:
        """Run group lives until the service stops; raise when supervision gives up."""
        assert self._stopping is not None
        delay = self._restart_backoff
        # Restarts since a producer last advanced an event: what restart_limit bounds.
        # An advance still finishing in an ended group's stop counts for the next
        # life: late, never lost, and always a real advance.
        futile = 0
        advanced = self._factory.advanced_events
        while not self._stopping.is_set():
            progress = self._progress()
            cause = await self._session()
            if cause is None or self._stopping.is_set():
                return
            failure = self._factory.failure
            if failure is not None and cause.__cause__ is failure:
                # Every new producer would fail the same way: a configuration error.
                failure.add_note(
                    f"service {self.key!r} refused its producer: a configuration error, not retried"
                    if isinstance(failure, DeadLetterMissing)
                    else f"raised by the producer factory of service {self.key!r}: a "
                    "configuration error, not retried"
                )
                raise failure
            refusal = refusal_in(cause)
            if refusal is not None:
                await self._refusals.raise_or_wait(refusal, self._stopping)
                self._restarts += 1
                continue
            self._refusals.reason = None
            permanent = cause.__cause__
            if isinstance(permanent, PermanentError):
                permanent.add_note(
                    f"service {self.key!r} stopped: the broker refuses this for good, a "
                    "restart would not mend it"
                )
                raise permanent
            if self._factory.advanced_events != advanced:
                advanced = self._factory.advanced_events
                futile = 0
            if self._restart_limit is not None and futile >= self._restart_limit:
                cause.add_note(
                    f"not restarted: service {self.key!r} reached restart_limit="
                    f"{self._restart_limit} (restarts in a row with no message advanced)"
                )
                raise cause
            futile += 1
            if self._progress() != progress:
                delay = self._restart_backoff
            self._restarts += 1
            logger.warning(
                "service %r: the group ended (%s); restarting in %.3gs",
                self.key,
                ended_because(cause),
                delay,
            )
            try:
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            except TimeoutError:
                pass
            delay = min(delay * 2, self._max_restart_backoff)

    async def _session(self) -> StreamTerminated | None:
        """One group life: every handler subscribed until the group ends (its error)
        or the service stops (``None``). Handlers still in it when another saw the
        group end are cancelled. Cancellation: all of them are, and it propagates."""
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(worker.session()) for worker in self._workers]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    cause = task.result()  # a bug in a worker propagates
                    if cause is not None:
                        return cause
            return None
        finally:
            for task in tasks:
                # One cancellation each: a second one (asyncio.run() tearing down has
                # cancelled every task already) would cut short a handler's bounded
                # wait for the group's stop, and leave that stop unbounded.
                if not task.cancelling():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _progress(self) -> int:
        return sum(c.handled + c.rejected + c.failed + c.gave_up for c in self._counters.values())

    def _set_restart_limit(self, limit: int | None) -> None:
        """Caller: ``ackgate run --max-restarts``, before ``run()``; overrides the
        ``restart_limit`` the service was made with."""
        _check_restart_limit(limit)
        assert self._state == "new", "the restart limit is read by run()"
        self._restart_limit = limit

    def _set_retry_on_auth_error(self, seconds: float | None) -> None:
        """Caller: ``ackgate run --retry-on-auth-error``, before ``run()``; overrides
        the ``retry_on_auth_error`` the service was made with."""
        assert self._state == "new", "refusals are handled by run()"
        self._refusals = Refusals(self.key, seconds)

    # -- stopping ------------------------------------------------------------------

    async def stop(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 - docs/production.md#service-options
        """Stop gracefully and wait until ``run()`` returned.

        Nothing more is read from the broker (a message received now would reach
        no handler, yet count a delivery there) and no new message is handed to a
        handler; calls in progress get up to ``timeout`` seconds to finish, then
        are cancelled. What finished is
        advanced, the rest is left to broker redelivery, the producer is closed.
        Then the group's stop (its final advances, closing the producer) gets
        ``timeout`` seconds again, at least one: an advance still in flight after
        that is cancelled and its events are redelivered. So a stop returns within
        about twice ``timeout`` even when the broker stopped answering.
        Called before ``run()``, it makes ``run()`` return at once; called again,
        it waits the same way (the first timeout holds). Do not await it from a
        handler (it would wait for that handler): start it as a task instead.

        Cancellation stops the waiting only: the stop goes on.
        """
        check_number("timeout", timeout, minimum=0, finite=False)
        self._request_stop(timeout)
        if self._finished is not None:
            await asyncio.shield(self._finished)

    def _request_stop(self, timeout: float) -> None:
        """The first stop request sets the deadline; later ones change nothing."""
        if self._stop_at is None:
            self._stop_at = asyncio.get_running_loop().time() + timeout
            for worker in self._workers:
                worker.stop(self._stop_at, timeout)
            if self._stopping is not None:
                self._stopping.set()

    # -- observing -----------------------------------------------------------------

    def stats(self) -> ServiceStats:
        """The group's :class:`GroupStats` (if live) and per-handler counts. Cheap."""
        group = next((g for g in self._manager.stats() if g.key == self.key), None)
        behind = {} if group is None else group.behind
        return ServiceStats(
            key=self.key,
            state=self._state,
            group=group,
            handlers=MappingProxyType(
                {
                    hid: counters.snapshot(hid, behind.get(hid, 0))
                    for hid, counters in self._counters.items()
                }
            ),
            restarts=self._restarts,
            oldest=None if group is None else _named(group.oldest),
            refused=self._refusals.reason if group is None else None,
        )


def ended_because(error: BaseException) -> str:
    """``error`` and its cause for one log line, the cause's text once: left out when
    the error's own message already quotes it. A host name that does not resolve
    (``socket.gaierror`` anywhere in the chain) is said so: "unknown host"."""
    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__
    if cause is not None and repr(cause) not in text and str(cause) not in text:
        text += f"; cause: {type(cause).__name__}: {cause}"
    chained: BaseException | None = error
    while chained is not None:
        if isinstance(chained, socket.gaierror):
            return f"unknown host: {text}" if "unknown host" not in text else text
        chained = chained.__cause__ or chained.__context__
    return text


def _named(oldest: OldestOutstanding | None) -> OldestMessage | None:
    """The group's oldest event as a message (a service's events are its messages)."""
    if oldest is None:
        return None
    message = oldest.raw_event
    if not isinstance(message, Message):  # pragma: no cover - a service converts each event
        return None
    return OldestMessage(
        lane=oldest.lane,
        key=message.key,
        id=message.id,
        handlers=tuple(str(holder) for holder in oldest.holders),
        age=oldest.age,
    )


def _check_restart_limit(limit: object) -> None:
    if limit is not None:
        check_int("restart_limit", limit, minimum=0)
