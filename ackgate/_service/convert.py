"""The conversion point of a :class:`~ackgate.Service`: each event becomes a
:class:`~ackgate.Message` once, in the group's poll, before it is fanned out.

:class:`MessageProducer` wraps the user's producer. Its stream yields
``(producer.to_message(raw, payload), payload)``, so every handler receives the same
``Message`` object, and everything else is the inner producer's: ``advance``,
``get_advance_lane``, ``get_event_id``, ``broker_lag``, ``aclose`` and the connection reports
(``upstream_lost`` / ``upstream_back``) are the inner producer's (``advance``
counted once it returned). :class:`BatchMessageProducer` does the same for a
producer that yields :class:`~ackgate.EventBatch` es, one ``to_messages`` call per
batch. :class:`Converting` is the factory that makes them, once per group life.

A conversion error ends the group loudly (``StreamTerminated``, the error as
``__cause__``) rather than rejecting the one message: ``to_message`` failing is an
adapter bug or a misconfiguration (a producer whose events are not what the
service expects), which would otherwise dead-letter every message, silently. The
service restarts the group after a backoff and the broker redelivers; nothing is
advanced past the event meanwhile. A handler rejects bad *content*, with
:class:`~ackgate.Reject`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

from ackgate._contract.message import Message
from ackgate._contract.outcome import AdvanceItem, AdvanceRun, EventBatch
from ackgate._contract.producer import SharedStreamProducer, overrides
from ackgate._contract.progress import SubscriberProgress
from ackgate._contract.stats import BrokerLag
from ackgate._contract.upstream import Upstream


class MessageProducer(SharedStreamProducer):
    """``inner`` with ``Message`` raw events. Opens nothing until :meth:`open_stream`."""

    def __init__(
        self,
        inner: SharedStreamProducer,
        owner: Converting,
        observe: Callable[[Message], None] | None = None,
    ) -> None:
        self._inner = inner
        self._owner = owner
        #: Called with every message converted (``give_up_after`` needs to know
        #: which deliveries this process saw); ``None``: nobody asks.
        self._observe = observe
        #: Told ``(events, seconds, error or None)`` after each advance (metrics).
        self.observe_advance: Callable[[int, float, BaseException | None], None] | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """The inner stream, converted. Cancelled at a yield or while the inner stream
        waits, the inner stream is closed (its ``finally`` runs) before this one's ends."""
        stream = self._inner.open_stream()
        to_message = self._inner.to_message
        observe = self._observe
        try:
            async for item in stream:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise TypeError(
                        "open_stream must yield (raw_event, broker_payload) pairs, "
                        f"got {type(item).__name__}"
                    )
                raw, payload = item
                message = to_message(raw, payload)
                if observe is not None:
                    observe(message)
                yield message, payload
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return self._inner.get_advance_lane(broker_payload)

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        return self._inner.get_event_id(broker_payload)

    def broker_lag(self) -> BrokerLag | None:
        return self._inner.broker_lag()

    def _watch_upstream(self, upstream: Upstream | None) -> None:
        # The inner producer is the one that reports its connection.
        self._inner._watch_upstream(upstream)

    def _watch_subscriber_progress(self, progress: SubscriberProgress | None) -> None:
        # The inner producer is the one that records progress with its commits.
        self._inner._watch_subscriber_progress(progress)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """The inner producer's ``advance``; raising or cancellation as there. (A group
        calls :meth:`advance_runs`; this is the abstract method's due.)"""
        await self._timed(self._inner.advance(batch), len(batch))

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        """The inner producer's ``advance_runs`` (its default expands the runs into one
        ``advance``); raising or cancellation as there."""
        await self._timed(
            self._inner.advance_runs(runs), sum(len(run.broker_payloads) for run in runs)
        )

    async def _timed(self, call: Awaitable[None], events: int) -> None:
        """Await the inner producer's advance of ``events`` events: told to
        ``observe_advance`` (if set) with its duration, counted once it returned."""
        observe = self.observe_advance
        if observe is None:
            await call
            self._owner.advanced(events)
            return
        start = time.perf_counter()
        try:
            await call
        except BaseException as error:
            observe(events, time.perf_counter() - start, error)
            raise
        observe(events, time.perf_counter() - start, None)
        self._owner.advanced(events)

    async def aclose(self) -> None:
        """The inner producer's ``aclose``; it is awaited once, as the group awaits this."""
        await self._inner.aclose()


class BatchMessageProducer(MessageProducer):
    """``inner``'s batches with ``Message`` raw events (``inner`` overrides
    ``open_stream_batches``; the group then reads this one's)."""

    async def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        """The inner batches, converted; cancellation as in :meth:`open_stream`."""
        stream = self._inner.open_stream_batches()
        to_messages = self._inner.to_messages
        try:
            async for batch in stream:
                if not isinstance(batch, EventBatch):
                    raise TypeError(
                        f"open_stream_batches must yield EventBatch, got {type(batch).__name__}"
                    )
                messages: list[Message] = to_messages(batch)
                if self._observe is not None:
                    for message in messages:
                        self._observe(message)
                yield batch._replace(raw_events=messages)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


class DeadLetterMissing(ValueError):
    """A handler sets ``give_up_after`` and the producer has no dead-letter destination.

    A configuration error that every new producer repeats: like any other error of
    the factory, supervision does not restart on it, ``run()`` raises it.
    """


class Converting:
    """The factory a service gives its group: calls the user's ``factory`` once per
    group life and wraps what it made. Caller: the group's poll, one call per life.

    ``giving_up()`` names the handlers that set ``give_up_after`` (handler id -> its
    value); see :func:`check_dead_letter`. When there is any, ``observe`` is called
    with every message converted. It also keeps what the service's
    supervision needs to tell a configuration error from an outage: the exception
    the factory itself raised (or the refusal of what it made), and how many events
    the producers it made have advanced.
    """

    def __init__(
        self,
        factory: Callable[[], SharedStreamProducer],
        giving_up: Callable[[], Mapping[str, int]] = dict,
        observe: Callable[[Message], None] | None = None,
        made: Callable[[MessageProducer, SharedStreamProducer], None] | None = None,
    ) -> None:
        self._factory = factory
        self._giving_up = giving_up
        self._observe = observe
        #: Told ``(wrapper, inner)`` of every producer made (telemetry); may be ``None``.
        self._made = made
        #: The exception of the last call that did not produce a producer (the factory
        #: raised, returned something else, or made a producer refused by
        #: :func:`check_dead_letter`); ``None`` after a call that did.
        self.failure: Exception | None = None
        #: Events advanced by every producer made so far: grows only once an
        #: ``advance`` call returned, so a failed commit is not progress.
        self.advanced_events = 0

    def __call__(self) -> MessageProducer:
        self.failure = None
        try:
            inner = self._factory()
            if not isinstance(inner, SharedStreamProducer):
                raise TypeError(
                    f"producer() must return a SharedStreamProducer, got {type(inner).__name__}"
                )
            handlers = self._giving_up()
            check_dead_letter(inner, handlers)
        except Exception as exc:
            self.failure = exc
            raise
        observe = self._observe if handlers else None
        wrapper = (
            BatchMessageProducer(inner, self, observe)
            if overrides(inner, "open_stream_batches")
            else MessageProducer(inner, self, observe)
        )
        if self._made is not None:
            self._made(wrapper, inner)
        return wrapper

    def advanced(self, count: int) -> None:
        """Caller: a producer made here, once its inner ``advance`` returned."""
        self.advanced_events += count


def check_dead_letter(producer: SharedStreamProducer, giving_up: Mapping[str, int]) -> None:
    """Refuse ``producer`` when a handler gives up on messages and it cannot store them.

    Giving up rejects a message; a reject that the producer does not store anywhere
    (``dead_letter_destination()`` is ``None``) would drop it. Raises
    :class:`DeadLetterMissing` naming the option and the first such handler.
    """
    if giving_up and producer.dead_letter_destination() is None:
        handler_id, limit = next(iter(giving_up.items()))
        raise DeadLetterMissing(
            f"handler {handler_id!r} sets give_up_after={limit}, but the producer "
            f"({type(producer).__name__}) has no dead-letter destination "
            "(dead_letter_destination() is None), so a message given up on would be "
            "dropped: configure the producer's dead-letter destination (Kafka and "
            "Pub/Sub: dlq_topic, SQS: dlq_queue_url) or remove give_up_after"
        )
