"""Google Cloud Pub/Sub adapter: one pull subscription shared by every subscriber of a group.

Install with ``pip install 'ackgate[pubsub]'``. Everything runs on the SDK's asyncio
GAPIC clients (unary ``pull`` in the group's poll task), no thread per message.

What each message's ``AdvanceOutcome`` does to the broker:

* **clean** (every subscriber acked) -> ``acknowledge``.
* **failed** by anyone, or broadcast to **zero** subscribers -> nack
  (``modify_ack_deadline`` 0): prompt redelivery. A failure wins over a rejection, so
  the subscriber that did not handle the message gets it again.
* **rejected** (nobody failed) -> with ``dlq_topic``: published there (data, attributes
  and ordering key, plus ``ackgate-source-subscription`` and ``ackgate-reason``:
  "rejected by R of N subscribers", then each reason given (docs/concepts.md#deferred-resolution,
  ``"<subscriber_id>: <reason>"``) separated by ``"; "``, cut to 1024 bytes), then
  acknowledged. Without ``dlq_topic``: nacked, so the subscription's own dead-letter
  policy moves it to its dead-letter topic after ``max_delivery_attempts`` (until then
  it is redelivered and rejected again; with no such policy it comes back forever).

Acks and nacks go out from a background task, coalesced across lanes and batches
(what is queued while one call is in flight goes in the next; 1000 ack ids a call at
most), in the order ``advance`` queued them. A failed send is logged at ERROR and ends
the group at the next ``advance`` or pull; its messages are nacked on close.

Lanes: the ordering key when a message has one (enable message ordering on the
subscription for the server's per-key order), else each message is its own lane.

Leases: every pulled message gets ``modify_ack_deadline(ack_deadline)`` on receipt and
again, in one call for all that are due, whenever less than half is left, until it is
settled. At most ``max_outstanding`` messages are held; beyond that the poll waits.
When the group ends, what was never settled is nacked in ``aclose``, so it comes back
at once rather than when its lease runs out.

Suspended at a ``yield`` (docs/writing-an-adapter.md#1-the-producer: backpressure, a paused rostered
group). Leases are kept by a task of their own, not by the poll, and a message is leased from the
moment its ``pull`` returns, not from its ``yield``: every message of the pull being yielded, the
ones the group has not taken yet included, keeps its lease however long the generator waits, and no
pull is sent meanwhile. Pub/Sub puts no cap on how often a lease is extended; a message held longer
than the subscription's retention (7 days by default) may be dropped by the server, which only ever
costs that message's ack (it is then refused and logged).
``tests/adapters/pubsub/test_pubsub_suspended.py`` suspends a group for 2.5 ack deadlines and checks
that another puller of the subscription got nothing meanwhile.

Identity and messages: :meth:`PubSubStreamProducer.get_event_id` is the ``message_id``
(docs/concepts.md#redelivery-memory). :meth:`PubSubStreamProducer.to_message` gives handlers
``body`` = ``data``, ``key`` = the ordering key as UTF-8 bytes (``None`` when empty), ``headers`` =
the attributes as UTF-8 bytes, ``id`` = ``message_id``, ``attempt`` = ``delivery_attempt``. Pub/Sub
counts delivery attempts only on a subscription with a dead-letter policy (and that count survives
restarts); elsewhere it sends 0, and the producer counts the deliveries of each ``message_id`` it
pulled itself (:class:`~ackgate.DeliveryCounts`), for its own life: a new producer (a restart of the
group, a new process) counts from 1.

Exactly-once subscriptions report per-ack-id failures: transient ones are retried,
permanent ones (an expired ack id) are logged at WARNING with the message id, not
fatal, since Pub/Sub redelivers. A message whose receipt lease is refused is not
handed out.

Logging on ``ackgate.adapters.pubsub``: message ids, counts and reasons, never data or
attributes. SDK errors surface as :class:`PubSubError`, the SDK exception as
``__cause__``. ``PUBSUB_EMULATOR_HOST`` is honoured: plaintext gRPC to that host, no
credentials, ``client_options`` / ``credentials`` unused.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from logging import getLogger
from typing import Any

from ackgate import AdvanceItem, AdvanceOutcome, DeliveryCounts, Message, SharedStreamProducer
from ackgate_pubsub._ack_calls import AckCall, run_ack_call
from ackgate_pubsub._dead_letter import publish_dead_letters
from ackgate_pubsub._errors import PubSubError
from ackgate_pubsub._message import Received, to_message

try:
    import grpc  # type: ignore[import-untyped,unused-ignore]
    from google.api_core import exceptions as gexc
    from google.pubsub_v1 import PublisherAsyncClient, PullResponse, SubscriberAsyncClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport
except ImportError as _exc:  # deferred: importing this module must not need the SDK
    _SDK_MISSING: ImportError | None = _exc
else:
    _SDK_MISSING = None

logger = getLogger("ackgate.adapters.pubsub")

#: Causes of a failed pull that mean the service could not be reached (or failed on
#: its side), as opposed to a wrong request.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    ()
    if _SDK_MISSING is not None
    else (gexc.ServiceUnavailable, gexc.InternalServerError, gexc.Unknown, gexc.RetryError)
)

# Pull responses may exceed gRPC's 4 MiB default; the SDK lifts the limit the same way.
_NO_SIZE_LIMIT = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class PubSubStreamProducer(SharedStreamProducer):
    """Share one Pub/Sub pull subscription among a group's subscribers.

    ``open_stream`` yields ``(received, received)``: the plain protobuf
    ``google.pubsub.v1.ReceivedMessage`` as pulled (``.message.data``,
    ``.message.attributes``, ``.message.message_id``, ``.message.ordering_key``,
    ``.delivery_attempt``) is both raw event and broker payload; the SDK's proto-plus
    wrapper costs more per event than the rest of the path. Settle only through ackgate.

    ``subscription`` / ``dlq_topic`` are full names (``projects/P/subscriptions/S``,
    ``projects/P/topics/T``). ``max_messages`` (1-1000) caps one ``pull``;
    ``ack_deadline`` (10-600 s) is the lease kept on outstanding messages;
    ``max_outstanding`` (>= 2) caps messages held between pull and settlement: keep it
    above what your subscribers hold with unconfirmed outputs, and at most
    ``subscriber_queue_size`` so a burst cannot overflow a queue. ``pull_timeout``
    bounds one long-poll. ``client_options`` / ``credentials`` go to both SDK clients.
    The broker-side contract is in the module docstring.
    """

    messaging_system = "gcp_pubsub"

    def __init__(
        self,
        subscription: str,
        *,
        max_messages: int = 100,
        ack_deadline: int = 60,
        max_outstanding: int = 1000,
        dlq_topic: str | None = None,
        pull_timeout: float = 30.0,
        client_options: Any = None,
        credentials: Any = None,
    ) -> None:
        _check_name("subscription", subscription, "subscriptions")
        if dlq_topic is not None:
            _check_name("dlq_topic", dlq_topic, "topics")
        if not 1 <= max_messages <= 1000:
            raise ValueError(f"max_messages must be within 1..1000, got {max_messages!r}")
        if not 10 <= ack_deadline <= 600:
            raise ValueError(f"ack_deadline must be within 10..600 s, got {ack_deadline!r}")
        if max_outstanding < 2:
            raise ValueError(f"max_outstanding must be >= 2, got {max_outstanding!r}")
        if pull_timeout <= 0:
            raise ValueError(f"pull_timeout must be > 0, got {pull_timeout!r}")
        self._subscription = subscription
        self._dlq_topic = dlq_topic
        self._max_messages = max_messages
        self._ack_deadline = ack_deadline
        self._max_outstanding = max_outstanding
        self._pull_timeout = pull_timeout
        self._client_options = client_options
        self._credentials = credentials
        self._subscriber: SubscriberAsyncClient | None = None
        self._publisher: PublisherAsyncClient | None = None
        self._lease_task: asyncio.Task[None] | None = None
        # Invariant: holds exactly the messages pulled and not yet settled (acked or
        # nacked), as ack id -> monotonic time their current lease runs out.
        self._leases: dict[str, float] = {}
        # Settlements queued by advance, not yet taken by the flush task: ack id ->
        # acknowledge (else nack). A subset of _leases, whose expiry is then inf.
        self._queued: dict[str, bool] = {}
        self._flush_task: asyncio.Task[None] | None = None
        self._broken: PubSubError | None = None
        # Message ids by ack id, only so that failures can be logged by message id.
        self._message_ids: dict[str, str] = {}
        self._room = asyncio.Event()
        #: Deliveries per message id in this producer's life, for ``Message.attempt``
        #: where Pub/Sub counts none (a subscription without a dead-letter policy).
        self._deliveries = DeliveryCounts()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The ordering key, or the ack id (its own lane) when the key is empty."""
        received: Received = broker_payload
        lane: str = received.message.ordering_key or received.ack_id
        return lane

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        """The ``message_id``: the same for every delivery of one message
        (docs/concepts.md#redelivery-memory)."""
        received: Received = broker_payload
        message_id: str = received.message.message_id
        return message_id

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """The :class:`~ackgate.Message` of one pulled message (see the module docstring)."""
        received: Received = raw_event
        attempt = received.delivery_attempt or self._deliveries.get(received.message.message_id)
        return to_message(received, self.get_advance_lane(broker_payload), attempt or 1)

    def destination_name(self) -> str:
        """What it reads, for spans' ``messaging.destination.name``."""
        return self._subscription

    def dead_letter_destination(self) -> str | None:
        """``"Pub/Sub topic <dlq_topic>"``; ``None`` without ``dlq_topic``: a rejected
        message is then nacked, and only the subscription's dead-letter policy (if
        any) ever moves it, after ``max_delivery_attempts``."""
        return None if self._dlq_topic is None else f"Pub/Sub topic {self._dlq_topic}"

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Connect, then long-poll the subscription forever.

        Raises :class:`PubSubError` when a pull fails (after the SDK's own retries) or
        a background send failed. A pull that could not reach the service
        (``UNAVAILABLE``, ``INTERNAL``, ``UNKNOWN``, or the SDK's retries running out
        on those) is reported with ``upstream_lost`` first, and the first pull that
        answers reports it back: the outage is logged once, however many restarts
        of the group it takes. Cancellation: the pull in flight is dropped (what
        the server put in it returns after the subscription's ack deadline); messages
        already pulled stay leased until :meth:`aclose` nacks them.
        """
        self._connect()
        subscriber = self._subscriber
        assert subscriber is not None
        while True:
            while len(self._leases) >= self._max_outstanding and self._broken is None:
                self._room.clear()
                await self._room.wait()
            self._raise_if_broken()
            room = self._max_outstanding - len(self._leases)
            try:
                received = await self._pull(subscriber, min(self._max_messages, room))
            except PubSubError as exc:
                if isinstance(exc.__cause__, _UNREACHABLE):
                    # Said once per outage, even across the restarts that follow.
                    self.upstream_lost(self._address(), exc.__cause__)
                raise
            self.upstream_back()
            for message in await self._lease_on_receipt(received):
                if not message.delivery_attempt:  # no dead-letter policy: count ourselves
                    self._deliveries.add(message.message.message_id)
                yield message, message

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Dead-letter what needs it, then queue each message's ack or nack.

        Returns once the settlements are queued: a background task sends them
        coalesced with those of other lanes (unkeyed messages are one-message lanes,
        so a call per batch would mean a call per message). Raises
        :class:`PubSubError` when a dead-letter publish fails, or when an earlier
        send failed (logged at ERROR when it happened); the group then ends and what
        was not settled is nacked in :meth:`aclose`. Cancellation: only the
        dead-letter publish awaits; its messages stay leased and are nacked on close.
        """
        self._raise_if_broken()
        settle: dict[str, bool] = {}  # ack id -> acknowledge (True) or nack (False)
        dead: list[tuple[Received, AdvanceOutcome]] = []
        for payload, outcome in batch:
            message: Received = payload
            if outcome.failed == 0 and outcome.rejected > 0:
                dead.append((message, outcome))
            settle[message.ack_id] = outcome.is_clean
        if dead and self._dlq_topic is not None:
            assert self._publisher is not None  # made in _connect when there is a dlq_topic
            await publish_dead_letters(self._publisher, self._dlq_topic, self._subscription, dead)
            settle.update((message.ack_id, True) for message, _ in dead)
        self._queued.update(settle)
        for ack_id in settle:
            self._leases[ack_id] = math.inf  # settled soon: no more extensions
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(
                self._flush(), name=f"ackgate pubsub settlements {self._subscription}"
            )

    async def aclose(self) -> None:
        """Send the queued settlements, nack what was never advanced, close both clients.

        Best-effort: a failed nack is logged (those messages come back when their
        lease runs out) and the clients are closed regardless.
        """
        if self._lease_task is not None:
            self._lease_task.cancel()
            await asyncio.gather(self._lease_task, return_exceptions=True)
        if self._flush_task is not None:
            await asyncio.gather(self._flush_task, return_exceptions=True)
        abandoned = list(self._leases)
        self._leases.clear()
        self._message_ids.clear()
        subscriber, publisher = self._subscriber, self._publisher
        try:
            if abandoned and subscriber is not None:
                # Refusals need no log: the lease of those ids has lapsed already.
                await self._settle("nack on close", self._nack, abandoned)
        except PubSubError as exc:
            logger.warning(
                "Could not nack %d abandoned messages on %s: %s; they return when "
                "their lease runs out",
                len(abandoned),
                self._subscription,
                exc.__cause__,
            )
        finally:
            self._subscriber = self._publisher = None
            try:
                if subscriber is not None:
                    await _close(subscriber.transport)
            finally:
                if publisher is not None:
                    await _close(publisher.transport)

    async def _flush(self) -> None:
        """Send queued settlements until none is left. Caller: the task made in advance.

        Whatever is queued while a call is in flight goes out together in the next.
        """
        while self._queued:
            sending, self._queued = self._queued, {}
            try:
                refused = await self._settle(
                    "acknowledge", self._acknowledge, [a for a, ok in sending.items() if ok]
                )
                refused.update(
                    await self._settle(
                        "nack", self._nack, [a for a, ok in sending.items() if not ok]
                    )
                )
            except PubSubError as exc:
                # Still leased, so aclose nacks them; the group ends at the next advance.
                self._fail(exc)
                self._queued.clear()
                logger.error(
                    "Settling %d messages on %s failed: %s; they will be redelivered",
                    len(sending),
                    self._subscription,
                    exc.__cause__,
                )
                return
            self._log_refused("settlement", refused)
            for ack_id in sending:
                self._leases.pop(ack_id, None)
                self._message_ids.pop(ack_id, None)
            if len(self._leases) < self._max_outstanding:
                self._room.set()

    def _connect(self) -> None:
        if _SDK_MISSING is not None:
            raise ImportError(
                "ackgate-pubsub needs google-cloud-pubsub: pip install 'ackgate[pubsub]'"
            ) from _SDK_MISSING
        self._subscriber = self._client(SubscriberAsyncClient, SubscriberGrpcAsyncIOTransport)
        if self._dlq_topic is not None:
            self._publisher = self._client(PublisherAsyncClient, PublisherGrpcAsyncIOTransport)
        self._lease_task = asyncio.get_running_loop().create_task(
            self._extend_leases(), name=f"ackgate pubsub leases {self._subscription}"
        )
        self._lease_task.add_done_callback(self._lease_task_done)

    def _address(self) -> str:
        """Where the subscription is read from, for the outage log line."""
        options = self._client_options
        endpoint = os.environ.get("PUBSUB_EMULATOR_HOST") or (
            getattr(options, "api_endpoint", None)
            or (options.get("api_endpoint") if isinstance(options, dict) else None)
            or "pubsub.googleapis.com"
        )
        return f"{endpoint} {self._subscription}"

    def _client(self, client: Any, transport: Any) -> Any:
        emulator = os.environ.get("PUBSUB_EMULATOR_HOST")
        if emulator:
            # Built by hand: not every supported SDK release points the async GAPIC
            # clients at the emulator by itself.
            channel = grpc.aio.insecure_channel(emulator, options=_NO_SIZE_LIMIT)
            return client(transport=transport(channel=channel))
        return client(credentials=self._credentials, client_options=self._client_options)

    async def _pull(self, subscriber: SubscriberAsyncClient, max_messages: int) -> list[Received]:
        try:
            response = await subscriber.pull(
                subscription=self._subscription,
                max_messages=max_messages,
                timeout=self._pull_timeout,
            )
        except gexc.DeadlineExceeded:
            return []  # the long-poll ran out with nothing to deliver
        except gexc.GoogleAPIError as exc:
            raise PubSubError(f"pull from {self._subscription} failed: {exc}") from exc
        return list(PullResponse.pb(response).received_messages)

    async def _lease_on_receipt(self, received: list[Received]) -> list[Received]:
        """Take the lease on freshly pulled messages; drop those the server refused."""
        if not received:
            return []
        expiry = time.monotonic() + self._ack_deadline
        for message in received:
            self._leases[message.ack_id] = expiry
            self._message_ids[message.ack_id] = message.message.message_id
        refused = await self._settle(
            "lease on receipt", self._modify, [message.ack_id for message in received]
        )
        self._log_refused("lease on receipt", refused)
        for ack_id in refused:
            self._leases.pop(ack_id, None)
            self._message_ids.pop(ack_id, None)
        return [message for message in received if message.ack_id not in refused]

    async def _extend_leases(self) -> None:
        """Keep every outstanding message leased. Caller: the task made in _connect."""
        while True:
            await asyncio.sleep(self._ack_deadline / 4)
            now = time.monotonic()
            due = [
                ack_id
                for ack_id, until in self._leases.items()
                if until - now < self._ack_deadline / 2
            ]
            if not due:
                continue
            previous = {ack_id: self._leases[ack_id] for ack_id in due}
            for ack_id in due:
                self._leases[ack_id] = now + self._ack_deadline
            try:
                refused = await self._settle("lease extension", self._modify, due)
            except Exception as exc:
                # Not fatal, whatever it is (a PubSubError, or a channel error the SDK
                # did not wrap): a dead task would let every lease of a suspended poll
                # lapse unnoticed. Not extended after all, so due again at the next
                # tick rather than half a deadline later, when they would have lapsed.
                for ack_id, until in previous.items():
                    if self._leases.get(ack_id) == now + self._ack_deadline:
                        self._leases[ack_id] = until
                logger.warning(
                    "Lease extension of %d messages on %s failed: %s",
                    len(due),
                    self._subscription,
                    exc.__cause__ if isinstance(exc, PubSubError) else repr(exc),
                )
                continue
            # Ids advanced while the call was in flight are expected to be refused.
            lapsed = {a: why for a, why in refused.items() if a in self._leases}
            self._log_refused("lease extension", lapsed)
            for ack_id in lapsed:
                self._leases[ack_id] = math.inf  # lost for good: stop extending it

    def _fail(self, error: PubSubError) -> None:
        """Record a background task's failure: the poll and the next advance raise it."""
        if self._broken is None:
            self._broken = error
        self._room.set()  # a poll waiting for room must see it too

    def _lease_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            error = PubSubError(f"lease extension on {self._subscription} stopped")
            error.__cause__ = task.exception()
            self._fail(error)

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise PubSubError(str(self._broken)) from self._broken.__cause__

    async def _acknowledge(self, ack_ids: list[str]) -> None:
        assert self._subscriber is not None
        await self._subscriber.acknowledge(subscription=self._subscription, ack_ids=ack_ids)

    async def _nack(self, ack_ids: list[str]) -> None:
        assert self._subscriber is not None
        await self._subscriber.modify_ack_deadline(
            subscription=self._subscription, ack_ids=ack_ids, ack_deadline_seconds=0
        )

    async def _modify(self, ack_ids: list[str]) -> None:
        assert self._subscriber is not None
        await self._subscriber.modify_ack_deadline(
            subscription=self._subscription,
            ack_ids=ack_ids,
            ack_deadline_seconds=self._ack_deadline,
        )

    async def _settle(self, what: str, call: AckCall, ack_ids: list[str]) -> dict[str, str]:
        """``call`` over ``ack_ids``; the ids refused for good, with why (see run_ack_call)."""
        return await run_ack_call(self._subscription, what, call, ack_ids)

    def _log_refused(self, what: str, refused: dict[str, str]) -> None:
        for ack_id, reason in refused.items():
            logger.warning(
                "%s refused for message %s on %s (%s); Pub/Sub will redeliver it",
                what,
                self._message_ids.get(ack_id, "?"),
                self._subscription,
                reason,
            )


def _check_name(argument: str, name: str, kind: str) -> None:
    project, _, rest = name.removeprefix("projects/").partition(f"/{kind}/")
    if not name.startswith("projects/") or not project or not rest:
        raise ValueError(f"{argument} must be a full name, projects/P/{kind}/N: {name!r}")


async def _close(transport: Any) -> None:
    close: Callable[[], Awaitable[None]] = transport.close  # the SDK leaves it untyped
    await close()
