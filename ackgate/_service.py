"""``Service``: decorated handlers over one shared stream, kept up by supervision.

A service is a user of the core's public API: its handlers are the roster (SPEC §7)
of one ack-mode group, each handler one subscription (:mod:`ackgate._worker`) whose
calls run concurrently, in order per lane or key (:mod:`ackgate._calls`), and
resolve the tickets bound to their messages (SPEC §8). The producer is wrapped so
each event is converted to a :class:`~ackgate.Message` once (:mod:`ackgate._convert`).

Lifecycle: *new* (handlers may be registered) → *running* (``run()``) → *stopped*.
While running, a group that ends (upstream failure, advance failure, factory
failure) is restarted after an exponential backoff; ``stop()`` ends the running.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from ackgate._convert import MessageProducer, converting
from ackgate._errors import StreamTerminated
from ackgate._handlers import HandlerCounters, HandlerSpec, HandlerStats, Ordering, check_spec
from ackgate._manager import SharedStreamManager
from ackgate._producer import SharedStreamProducer
from ackgate._retry import Retry
from ackgate._stats import GroupStats
from ackgate._telemetry import ServiceTelemetry, for_service
from ackgate._worker import HandlerWorker

logger = logging.getLogger("ackgate.service")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class ServiceStats:
    """A snapshot of a service, as returned by :meth:`Service.stats`.

    Attributes:
        key: The service's key.
        state: ``"new"`` (before ``run()``), ``"running"`` or ``"stopped"``.
        group: The group's statistics; ``None`` while no group is live (before
            ``run()``, during a restart backoff, after the stop).
        handlers: Per handler id, in registration order.
        restarts: Times the group was restarted after it ended.
    """

    key: Hashable
    state: Literal["new", "running", "stopped"]
    group: GroupStats | None
    handlers: Mapping[str, HandlerStats]
    restarts: int


class Service:
    """Handlers that each see every message of one stream; the broker advanced only
    once all of them acked or rejected it.

    ``producer`` is a zero-argument factory returning a :class:`SharedStreamProducer`
    (called once per group life, so again after each restart). ``options`` are
    :class:`SharedStreamManager` arguments, used when the service makes its own
    manager (``manager=None``; it is closed when ``run()`` returns); with
    ``manager=`` they must be empty. After the group ends, it is started again
    after ``restart_backoff`` seconds, doubling per consecutive restart up to
    ``max_restart_backoff`` (back to ``restart_backoff`` once a handler finished a
    message in the meantime).
    """

    def __init__(
        self,
        key: Hashable,
        *,
        producer: Callable[[], SharedStreamProducer],
        manager: SharedStreamManager | None = None,
        restart_backoff: float = 1.0,
        max_restart_backoff: float = 60.0,
        **options: Any,
    ) -> None:
        if key is None:
            raise ValueError("key must not be None")
        try:
            hash(key)
        except TypeError:
            raise ValueError(f"key must be hashable, got {type(key).__name__}") from None
        if isinstance(producer, SharedStreamProducer) or not callable(producer):
            raise TypeError(
                "producer must be a zero-argument factory returning a SharedStreamProducer "
                f"(it is called again on every restart), got {producer!r}"
            )
        for name, value in (
            ("restart_backoff", restart_backoff),
            ("max_restart_backoff", max_restart_backoff),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if max_restart_backoff < restart_backoff:
            raise ValueError(
                f"max_restart_backoff ({max_restart_backoff!r}) must be >= "
                f"restart_backoff ({restart_backoff!r})"
            )
        if manager is not None and options:
            raise ValueError(
                f"manager options {sorted(options)} apply only to the service's own manager; "
                "configure the manager you pass instead"
            )
        self.key = key
        self._manager = SharedStreamManager(**options) if manager is None else manager
        self._owns_manager = manager is None
        self._factory = converting(producer, self._producer_made)
        self._restart_backoff = float(restart_backoff)
        self._max_restart_backoff = float(max_restart_backoff)
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
    ) -> Callable[[F], F]:
        """Register the decorated ``async def`` as handler ``handler_id``; return it unchanged.

        A per-message handler (``batch_size=1``) is called with one
        :class:`~ackgate.Message`: returning acks it, ``raise Reject(reason)``
        rejects it (dead-lettered, never retried), any other exception is retried
        per ``retry``, then the message fails for this handler and is redelivered.
        Retries, backoffs included, count against the manager's ``ack_timeout``: a
        message not resolved by then fails for this handler, its calls in progress
        are cancelled and it is subscribed again (the broker redelivers).
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

        Ids are unique (``ValueError``); registering once ``run()`` started is a
        ``RuntimeError``. Invalid options are a ``ValueError`` (``TypeError`` for a
        function that is not ``async def``, or ``retry`` not a ``Retry``).
        """

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
            )
            self._specs[spec.id] = spec
            self._counters[spec.id] = HandlerCounters()
            return function

        return register

    # -- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Run the handlers until :meth:`stop` (or cancellation); then return.

        ``ValueError`` without handlers; ``RuntimeError`` if called twice. When the
        group ends it is logged and started again after the restart backoff; a
        handler force-failed by the ack timeout is subscribed again at once.

        Cancellation is a hard stop: calls in progress are cancelled (their events
        fail and are redelivered), what was already resolved is advanced, the
        producer is closed, then ``CancelledError`` propagates.
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
                invoke=None if telemetry is None else telemetry.handler(spec),
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

    def _producer_made(self, wrapper: MessageProducer, inner: SharedStreamProducer) -> None:
        if self._telemetry is not None:
            self._telemetry.producer_made(wrapper, inner)

    async def _supervise(self) -> None:
        assert self._stopping is not None
        delay = self._restart_backoff
        while not self._stopping.is_set():
            progress = self._progress()
            cause = await self._session()
            if cause is None or self._stopping.is_set():
                return
            if self._progress() != progress:
                delay = self._restart_backoff
            self._restarts += 1
            logger.warning(
                "service %r: the group ended (%s: %s; cause: %r); restarting in %.3gs",
                self.key,
                type(cause).__name__,
                cause,
                cause.__cause__,
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
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _progress(self) -> int:
        return sum(c.handled + c.rejected + c.failed for c in self._counters.values())

    # -- stopping ------------------------------------------------------------------

    async def stop(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 - SPEC §12
        """Stop gracefully and wait until ``run()`` returned.

        No new message is handed to a handler; calls in progress get up to
        ``timeout`` seconds to finish, then are cancelled. What finished is
        advanced, the rest is left to broker redelivery, the producer is closed.
        Called before ``run()``, it makes ``run()`` return at once; called again,
        it waits the same way (the first timeout holds). Do not await it from a
        handler (it would wait for that handler): start it as a task instead.

        Cancellation stops the waiting only: the stop goes on.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        if self._stop_at is None:
            self._stop_at = asyncio.get_running_loop().time() + timeout
            for worker in self._workers:
                worker.stop(self._stop_at)
            if self._stopping is not None:
                self._stopping.set()
        if self._finished is not None:
            await asyncio.shield(self._finished)

    # -- observing -----------------------------------------------------------------

    def stats(self) -> ServiceStats:
        """The group's :class:`GroupStats` (if live) and per-handler counts. Cheap."""
        group = next((g for g in self._manager.stats() if g.key == self.key), None)
        return ServiceStats(
            key=self.key,
            state=self._state,
            group=group,
            handlers=MappingProxyType(
                {hid: counters.snapshot(hid) for hid, counters in self._counters.items()}
            ),
            restarts=self._restarts,
        )
