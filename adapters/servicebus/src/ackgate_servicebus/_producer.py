"""Azure Service Bus adapter: one PEEK_LOCK receiver on a queue or a topic subscription.

Install with ``pip install 'ackgate[servicebus]'`` (``azure-servicebus``, its ``aio`` API).

What each :class:`~ackgate.AdvanceOutcome` does to a message:

* clean (acked by every subscriber) -> ``complete_message``: removed from the entity.
* rejected by at least one subscriber and failed by none -> ``dead_letter_message``
  with reason ``"ackgate-rejected"`` and as ``error_description`` "rejected by R of N ackgate
  subscribers", then each reason given (docs/concepts.md#deferred-resolution, ``"<subscriber_id>:
  <reason>"``) separated by ``"; "``, at most 4096 characters: moved to the entity's dead-letter
  sub-queue.
* failed by at least one subscriber, or broadcast to nobody -> ``abandon_message``:
  the broker redelivers it at once with ``delivery_count`` + 1 (the entity's
  MaxDeliveryCount eventually dead-letters a message that keeps failing).
* lock lost before the advance (a renewal failed) -> not settled, whatever the
  outcome: settling with a lost lock is refused by the broker, which redelivers the
  message once the lock has lapsed. The event thus behaves as *failed*.

Locks: every received message is held under a renewed lock from the moment it is
received until it is advanced (or abandoned in :meth:`ServiceBusStreamProducer.aclose`);
on session entities the session lock is renewed instead, since message locks there
are the session's. The SDK renews one message per call, so renewals that fall due
together run concurrently, at most 32 in flight: hundreds of held messages are renewed
in a few round trips, not one after another. A renewal failure is logged at WARNING
with the message id and sequence number; a lost *session* lock ends the group
(``open_stream`` raises), since another consumer may now be handed that session's later
messages.

Suspended at a ``yield`` (docs/writing-an-adapter.md#1-the-producer: backpressure, a paused rostered
group). Renewal is a task of its own, not part of the poll, and a message is held from the moment
``receive_messages`` returns it, not from its ``yield``: every message of the batch being yielded,
the ones the group has not taken yet included, keeps its lock (or its session's lock) however long
the generator waits, and nothing more is received meanwhile. Service Bus puts no cap on renewals.
One thing renewal cannot reach: messages the SDK *prefetched* (``prefetch_count`` > 0) sit in its
buffer, locked since they arrived, until a receive takes them. A message whose lock has less than
``lock_renewal_margin`` left when it is received is therefore renewed at once, and one whose lock is
already gone is not handed out at all (logged at WARNING; the broker redelivers it, with
``delivery_count`` + 1). With the default ``prefetch_count=0`` nothing sits unseen.
``tests/adapters/servicebus/ test_servicebus_suspended.py`` suspends a group for four lock
durations.

Identity and messages: :meth:`ServiceBusStreamProducer.get_event_id` is the ``sequence_number``
(docs/concepts.md#redelivery-memory: unique in the entity, the same on every delivery).
:meth:`ServiceBusStreamProducer.to_message` gives handlers ``body`` = the body bytes (a data body's
sections joined; a ``str`` value body as UTF-8), ``key`` = the ``session_id`` as UTF-8 bytes
(``None`` without sessions; the session is what orders messages, while ``partition_key`` only places
them and stays on ``message.raw``), ``headers`` = ``application_properties`` (keys as ``str``;
``bytes`` values as they are, ``str`` as UTF-8, anything else as its ``str()`` in UTF-8), ``id`` =
``message_id`` (the sequence number when a sender set none), ``attempt`` = ``delivery_count + 1``:
the Python SDK reports the AMQP count of *earlier* deliveries (0 the first time), so ``attempt`` is
1 on a first delivery, as SQS and Pub/Sub count.

Lanes: the session id on session entities (order is kept per session), otherwise the
sequence number, so every message is its own lane and one slow message holds back
nothing else. Raise ``max_concurrent_advances`` on the manager to settle several
lanes at once.

Logging (``ackgate.adapters.servicebus``): settlement and renewal failures at WARNING
with the message id and sequence number, never a body, a connection string or a key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from enum import Enum
from types import SimpleNamespace
from typing import Any, Final

from ackgate import AdvanceItem, AdvanceOutcome, Message, SharedStreamProducer
from ackgate_servicebus._dead_letter import DEAD_LETTER_REASON, error_description
from ackgate_servicebus._locks import Delivery, LockKeeper
from ackgate_servicebus._message import ids, to_message

__all__ = ["NEXT_AVAILABLE_SESSION", "ServiceBusStreamProducer"]

_log = logging.getLogger("ackgate.adapters.servicebus")

_CLOSE_TIMEOUT: Final = 10.0
"""Seconds :meth:`ServiceBusStreamProducer.aclose` spends abandoning unadvanced messages."""


class _NextAvailableSession:
    def __repr__(self) -> str:
        return "NEXT_AVAILABLE_SESSION"


NEXT_AVAILABLE_SESSION: Final = _NextAvailableSession()
"""Pass as ``session_id`` to take whichever session has messages, one after another.

The SDK's own ``azure.servicebus.NEXT_AVAILABLE_SESSION`` is accepted too.
"""


def _import_sdk() -> SimpleNamespace:
    try:
        from azure.servicebus import NEXT_AVAILABLE_SESSION as sdk_next_available
        from azure.servicebus import ServiceBusReceiveMode
        from azure.servicebus.aio import ServiceBusClient
        from azure.servicebus.exceptions import (
            MessageAlreadySettled,
            OperationTimeoutError,
            ServiceBusCommunicationError,
            ServiceBusConnectionError,
            ServiceBusError,
            SessionCannotBeLockedError,
        )
    except ImportError as exc:
        raise ImportError(
            "ackgate-servicebus needs azure-servicebus: pip install 'ackgate[servicebus]'"
        ) from exc
    return SimpleNamespace(
        client=ServiceBusClient,
        peek_lock=ServiceBusReceiveMode.PEEK_LOCK,
        next_available=sdk_next_available,
        # ServiceBusError covers lock lost, session lock lost and transport failures;
        # MessageAlreadySettled is a ValueError in the SDK.
        settlement_errors=(ServiceBusError, MessageAlreadySettled),
        no_session_errors=(OperationTimeoutError, SessionCannotBeLockedError),
        # The namespace cannot be reached: an outage, not a wrong request.
        unreachable_errors=(ServiceBusConnectionError, ServiceBusCommunicationError),
    )


def _endpoint_host(connection_string: str) -> str | None:
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint" and value.strip():
            host = value.strip().split("://", 1)[-1]
            return host.split("/", 1)[0] or None
    return None


class ServiceBusStreamProducer(SharedStreamProducer):
    """Reads one Service Bus queue or topic subscription in PEEK_LOCK mode for ackgate.

    Connect with exactly one of ``connection_string``, ``fully_qualified_namespace``
    plus ``credential`` (any credential ``ServiceBusClient`` accepts), or
    ``client_factory`` (a zero-argument callable returning an object with the
    ``azure.servicebus.aio.ServiceBusClient`` interface; tests pass a fake). Read
    exactly one of ``queue_name`` or ``topic_name`` plus ``subscription_name``.
    ``session_id`` is ``None`` for entities without sessions, a session id, or
    :data:`NEXT_AVAILABLE_SESSION` (one session at a time; an idle, fully advanced
    session is released and the next one with messages is taken).

    Each event is ``(message, payload)`` where ``message`` is the SDK's
    ``ServiceBusReceivedMessage``; subscribers must not settle it themselves.
    Outcomes, locks, lanes and logging are described in the module docstring.

    Every argument is checked here (``ValueError``); nothing connects until
    :meth:`open_stream`. Secrets are never shown by ``repr`` or in error messages.
    ``lock_renewal_margin``: a lock with fewer seconds left than this is renewed; the
    renewal loop wakes every third of it. ``client_options`` go to
    ``ServiceBusClient`` (``retry_total``, ``transport_type``, ...).
    """

    messaging_system = "servicebus"

    def __init__(
        self,
        *,
        connection_string: str | None = None,
        fully_qualified_namespace: str | None = None,
        credential: Any = None,
        client_factory: Callable[[], Any] | None = None,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        session_id: str | _NextAvailableSession | Enum | None = None,
        max_message_count: int = 32,
        prefetch_count: int = 0,
        max_wait_time: float = 5.0,
        lock_renewal_margin: float = 10.0,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        sources = [
            name
            for name, value in (
                ("connection_string", connection_string),
                ("fully_qualified_namespace", fully_qualified_namespace),
                ("client_factory", client_factory),
            )
            if value is not None
        ]
        if len(sources) != 1:
            raise ValueError(
                "give exactly one of connection_string, fully_qualified_namespace (with "
                f"credential) or client_factory; got {', '.join(sources) or 'none'}"
            )
        if connection_string is not None and (
            not isinstance(connection_string, str) or _endpoint_host(connection_string) is None
        ):
            raise ValueError("connection_string has no Endpoint=sb://... part (value not shown)")
        if (credential is not None) != (fully_qualified_namespace is not None):
            raise ValueError("credential goes with fully_qualified_namespace, and only with it")
        if client_options is not None and client_factory is not None:
            raise ValueError("client_options apply to the SDK client, not to client_factory")

        if queue_name is not None:
            if topic_name is not None or subscription_name is not None:
                raise ValueError("give queue_name or topic_name + subscription_name, not both")
            entity = f"queue {queue_name!r}"
        elif topic_name is not None and subscription_name is not None:
            entity = f"topic {topic_name!r} subscription {subscription_name!r}"
        else:
            raise ValueError("give queue_name, or topic_name together with subscription_name")
        for name, value in (
            ("fully_qualified_namespace", fully_qualified_namespace),
            ("queue_name", queue_name),
            ("topic_name", topic_name),
            ("subscription_name", subscription_name),
        ):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name} must be a non-empty string")

        next_available = session_id is NEXT_AVAILABLE_SESSION or (
            isinstance(session_id, Enum) and session_id.name == "NEXT_AVAILABLE"
        )
        if (
            not next_available
            and session_id is not None
            and (not isinstance(session_id, str) or not session_id)
        ):
            raise ValueError(
                "session_id must be None, a non-empty string or NEXT_AVAILABLE_SESSION"
            )
        if not isinstance(max_message_count, int) or max_message_count < 1:
            raise ValueError("max_message_count must be an int >= 1")
        if not isinstance(prefetch_count, int) or prefetch_count < 0:
            raise ValueError("prefetch_count must be an int >= 0")
        if not max_wait_time > 0:
            raise ValueError("max_wait_time must be > 0")
        if not lock_renewal_margin > 0:
            raise ValueError("lock_renewal_margin must be > 0")

        self._connection_string = connection_string
        self._namespace = fully_qualified_namespace
        self._credential = credential
        self._client_factory = client_factory
        self._client_options = dict(client_options or {})
        self._queue_name = queue_name
        self._topic_name = topic_name
        self._subscription_name = subscription_name
        self._entity = entity
        self._session_id = NEXT_AVAILABLE_SESSION if next_available else session_id
        self._next_available = next_available
        self._sessionful = session_id is not None
        self._max_message_count = max_message_count
        self._prefetch_count = prefetch_count
        self._max_wait_time = float(max_wait_time)
        self._lock_renewal_margin = float(lock_renewal_margin)

        self._sdk: SimpleNamespace | None = None
        self._client: Any = None
        self._receiver: Any = None
        self._locks = LockKeeper(self._lock_renewal_margin, sessionful=self._sessionful)

    def _address(self) -> str:
        """The namespace and entity, for the outage log line (never a credential)."""
        if self._connection_string is not None:
            namespace = _endpoint_host(self._connection_string)
        else:
            namespace = self._namespace or "<client_factory>"
        return f"{namespace} {self._entity}"

    def __repr__(self) -> str:
        if self._connection_string is not None:
            namespace = _endpoint_host(self._connection_string)
        else:
            namespace = self._namespace or "<client_factory>"
        session = f", session={self._session_id!r}" if self._sessionful else ""
        return f"ServiceBusStreamProducer(namespace={namespace!r}, {self._entity}{session})"

    # -- the stream ---------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Receive messages forever, yielding ``(message, payload)``.

        Opens the client here (closed in :meth:`aclose`, never in this generator)
        and starts the lock renewal loop. Raises when a receive fails, except that
        with :data:`NEXT_AVAILABLE_SESSION` "no session available" is waited out,
        and when a session lock was lost. A receive that cannot reach the namespace
        (``ServiceBusConnectionError``, ``ServiceBusCommunicationError``, after the
        SDK's own retries) is reported with ``upstream_lost`` before it ends the
        group; the first receive that answers reports it back. Cancellation arrives
        at the receive or a ``yield``; messages already received stay held and are abandoned in
        :meth:`aclose`.
        """
        sdk = self._sdk = _import_sdk()
        self._client = self._make_client(sdk)
        self._locks.start(lambda: self._receiver, name=f"ackgate renew {self!r}")
        _log.info("Receiving from Service Bus %s", self._entity)
        while True:
            if self._receiver is None:
                self._receiver = self._make_receiver(sdk)
            receiver = self._receiver
            try:
                messages = await receiver.receive_messages(
                    max_message_count=self._max_message_count, max_wait_time=self._max_wait_time
                )
            except sdk.no_session_errors:
                if not self._next_available or self._holds(receiver):
                    raise
                _log.debug("No Service Bus session available on %s; retrying", self._entity)
                await self._close_receiver()
                continue
            except sdk.unreachable_errors as exc:
                # Said once per outage, even across the restarts of the group that follow.
                self.upstream_lost(self._address(), exc)
                raise
            self.upstream_back()
            self._locks.check()
            if not messages:
                if self._next_available and not self._holds(receiver):
                    # Idle and fully advanced: let the next session with messages in.
                    await self._close_receiver()
                continue
            deliveries = [Delivery(m, receiver, self._lane_of(m)) for m in messages]
            self._locks.held.update(deliveries)
            deliveries = await self._locks.renew_on_receipt(deliveries)
            for delivery in deliveries:
                yield delivery.message, delivery

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The session id on session entities, else the message's sequence number."""
        lane: Hashable = broker_payload.lane
        return lane

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        """The ``sequence_number``: the same on every delivery of one message
        (docs/concepts.md#redelivery-memory)."""
        sequence_number: int = broker_payload.message.sequence_number
        return sequence_number

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """The :class:`~ackgate.Message` of one received message (module docstring)."""
        return to_message(raw_event, self.get_advance_lane(broker_payload))

    def destination_name(self) -> str:
        """What it reads, for spans' ``messaging.destination.name``."""
        return self._entity

    def dead_letter_destination(self) -> str:
        """The dead-letter sub-queue of the entity: every rejected message is moved
        there with ``dead_letter_message`` (reason ``"ackgate-rejected"``)."""
        return f"the dead-letter sub-queue of {self._entity}"

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Settle each message in order: complete, dead-letter or abandon (module docstring).

        Settlement errors (lock lost, already settled, session lock lost, transport)
        are logged with the message id and sequence number and do not raise: the
        broker redelivers what was not settled. Anything else raises and ends the
        group. Cancellation: the message being settled may or may not be settled.
        """
        for item in batch:
            await self._settle(item.broker_payload, item.outcome)

    async def aclose(self) -> None:
        """Stop renewing, abandon every message never advanced, close receiver and client.

        Best-effort and bounded: abandoning gives up after ``_CLOSE_TIMEOUT`` seconds
        (the locks then lapse on their own); the receiver and client are closed
        whatever happened before.
        """
        try:
            await self._locks.stop()
            await self._abandon_held()
        finally:
            try:
                await self._close_receiver()
            finally:
                client, self._client = self._client, None
                if client is not None:
                    await client.close()
                    _log.info("Closed Service Bus client for %s", self._entity)

    # -- helpers ------------------------------------------------------------------

    def _make_client(self, sdk: SimpleNamespace) -> Any:
        if self._client_factory is not None:
            return self._client_factory()
        try:
            if self._connection_string is not None:
                return sdk.client.from_connection_string(
                    self._connection_string, **self._client_options
                )
            return sdk.client(self._namespace, self._credential, **self._client_options)
        except Exception as exc:
            # The SDK's message may quote its input; the connection string holds a key.
            raise ValueError(
                f"could not create ServiceBusClient ({type(exc).__name__}); "
                "check the connection arguments (values not shown)"
            ) from None

    def _make_receiver(self, sdk: SimpleNamespace) -> Any:
        options: dict[str, Any] = {
            "receive_mode": sdk.peek_lock,
            "prefetch_count": self._prefetch_count,
            # On NEXT_AVAILABLE_SESSION this bounds the wait for a session.
            "max_wait_time": self._max_wait_time,
        }
        if self._sessionful:
            options["session_id"] = sdk.next_available if self._next_available else self._session_id
        if self._queue_name is not None:
            return self._client.get_queue_receiver(self._queue_name, **options)
        return self._client.get_subscription_receiver(
            self._topic_name, self._subscription_name, **options
        )

    def _lane_of(self, message: Any) -> Hashable:
        lane: Hashable = message.session_id if self._sessionful else message.sequence_number
        return lane

    def _holds(self, receiver: Any) -> bool:
        return any(delivery.receiver is receiver for delivery in self._locks.held)

    async def _close_receiver(self) -> None:
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            await receiver.close()

    async def _settle(self, delivery: Delivery, outcome: AdvanceOutcome) -> None:
        assert self._sdk is not None, "advance() before open_stream()"
        message, receiver = delivery.message, delivery.receiver
        delivery.settling = True
        try:
            if delivery.lock_lost:
                _log.warning(
                    "Service Bus lock was lost; not settling %s (%s); the broker redelivers it",
                    ids(message),
                    outcome,
                )
                return
            if outcome.is_clean:
                action, settlement = "complete", receiver.complete_message(message)
            elif outcome.rejected and not outcome.failed:
                action = "dead-letter"
                settlement = receiver.dead_letter_message(
                    message, reason=DEAD_LETTER_REASON, error_description=error_description(outcome)
                )
            else:
                action, settlement = "abandon", receiver.abandon_message(message)
            try:
                await settlement
            except self._sdk.settlement_errors as exc:
                _log.warning(
                    "Service Bus %s failed for %s (%s); the broker redelivers it",
                    action,
                    ids(message),
                    type(exc).__name__,
                )
        finally:
            self._locks.held.discard(delivery)

    async def _abandon_held(self) -> None:
        pending = [d for d in self._locks.held if not (d.lock_lost or d.settling)]
        self._locks.held.clear()
        if not pending or self._sdk is None:
            return
        _log.info("Abandoning %d unadvanced Service Bus messages on close", len(pending))
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                for delivery in pending:
                    try:
                        await delivery.receiver.abandon_message(delivery.message)
                    except self._sdk.settlement_errors as exc:
                        _log.debug(
                            "Abandon on close failed for %s (%s)",
                            ids(delivery.message),
                            type(exc).__name__,
                        )
        except TimeoutError:
            _log.warning("Gave up abandoning Service Bus messages on close; their locks lapse")
