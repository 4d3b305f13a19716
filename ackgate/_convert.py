"""The conversion point of a :class:`~ackgate.Service`: each event becomes a
:class:`~ackgate.Message` once, in the group's poll, before it is fanned out.

:class:`MessageProducer` wraps the user's producer. Its stream yields
``(producer.to_message(raw, payload), payload)``, so every handler receives the same
``Message`` object, and everything else is the inner producer's: ``advance``,
``get_advance_lane``, ``get_event_id`` and ``aclose`` are delegated unchanged.
:class:`BatchMessageProducer` does the same for a producer that yields
:class:`~ackgate.EventBatch` es, one ``to_messages`` call per batch.

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
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import Any

from ackgate._message import Message
from ackgate._outcome import AdvanceItem, EventBatch
from ackgate._producer import SharedStreamProducer


class MessageProducer(SharedStreamProducer):
    """``inner`` with ``Message`` raw events. Opens nothing until :meth:`open_stream`."""

    def __init__(self, inner: SharedStreamProducer) -> None:
        self._inner = inner
        #: Told ``(events, seconds, error or None)`` after each advance (metrics).
        self.observe_advance: Callable[[int, float, BaseException | None], None] | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """The inner stream, converted. Cancelled at a yield or while the inner stream
        waits, the inner stream is closed (its ``finally`` runs) before this one's ends."""
        stream = self._inner.open_stream()
        to_message = self._inner.to_message
        try:
            async for item in stream:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise TypeError(
                        "open_stream must yield (raw_event, broker_payload) pairs, "
                        f"got {type(item).__name__}"
                    )
                raw, payload = item
                yield to_message(raw, payload), payload
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return self._inner.get_advance_lane(broker_payload)

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        return self._inner.get_event_id(broker_payload)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """The inner producer's ``advance``; raising or cancellation as there."""
        observe = self.observe_advance
        if observe is None:
            await self._inner.advance(batch)
            return
        start = time.perf_counter()
        try:
            await self._inner.advance(batch)
        except BaseException as error:
            observe(len(batch), time.perf_counter() - start, error)
            raise
        observe(len(batch), time.perf_counter() - start, None)

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
                yield batch._replace(raw_events=messages)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


def converting(
    factory: Callable[[], SharedStreamProducer],
    made: Callable[[MessageProducer, SharedStreamProducer], None] | None = None,
) -> Callable[[], MessageProducer]:
    """A factory for the group: calls ``factory`` once per group and wraps what it made
    (then tells ``made(wrapper, inner)``, if given)."""

    def make() -> MessageProducer:
        inner = factory()
        if not isinstance(inner, SharedStreamProducer):
            raise TypeError(
                f"producer() must return a SharedStreamProducer, got {type(inner).__name__}"
            )
        wrapper = (
            BatchMessageProducer(inner)
            if type(inner).open_stream_batches is not SharedStreamProducer.open_stream_batches
            else MessageProducer(inner)
        )
        if made is not None:
            made(wrapper, inner)
        return wrapper

    return make
