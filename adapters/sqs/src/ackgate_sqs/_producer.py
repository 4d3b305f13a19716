"""Amazon SQS adapter on aiobotocore: ``pip install 'ackgate[sqs]'``.

:class:`SqsStreamProducer` long-polls one queue and yields every received message
as the raw event: the message ``dict`` exactly as botocore returns it (``Body``,
``MessageId``, ``Attributes`` with every system attribute, ``MessageAttributes``).

What each outcome does to the broker (:meth:`SqsStreamProducer.advance`):

* clean (acked by everyone, nobody failed or rejected) → ``DeleteMessageBatch``;
* any subscriber failed, or nobody was subscribed → visibility 0, so SQS
  redelivers it at once (once this producer's long poll in flight, if any, has
  returned: see :class:`SqsStreamProducer`);
* rejected (and nobody failed) → with ``dlq_queue_url``: sent to that queue
  (original body and message attributes plus ``ackgate.reason``: "rejected by R of N subscribers",
  then each reason given (docs/concepts.md#deferred-resolution, ``"<subscriber_id>: <reason>"``),
  separated by ``"; "``, at most 4096 characters), then deleted; without it: visibility 0, and the
  queue's own redrive policy moves it to its dead-letter queue once ``maxReceiveCount`` receives are
  used up. A queue with no redrive policy and no ``dlq_queue_url`` redelivers a rejected message
  forever.

On a FIFO queue SQS holds a group back while any of its messages is in flight, so
a released message returns only after the rest of its group received with it was
handled: subscribers then see it again, out of order (a duplicate, never a loss).
A group whose every subscriber was force-failed releases each message at once, so
SQS keeps redelivering it (and a redrive policy counts those receives).

Lanes: the ``MessageGroupId`` on a FIFO queue (URL ending in ``.fifo``), so a
group's messages advance in order while other groups proceed; on a standard queue
every message is its own lane, so nothing waits behind a slow message. Deletes and
releases of advances running at the same time are merged into batch calls of up to
ten, so on a standard queue give the manager ``max_concurrent_advances=10`` (or
more): with the default of 1 every message costs a request of its own.

While a message is received and not yet advanced, a heartbeat extends its
visibility (``ChangeMessageVisibilityBatch``) before it lapses, so a handler slower
than ``visibility_timeout`` causes no redelivery.

Suspended at a ``yield`` (docs/writing-an-adapter.md#1-the-producer: backpressure, a paused rostered
group). The heartbeat is a task of its own, not part of the poll, and a message counts as held from
the moment ``ReceiveMessage`` returns it — not from its ``yield`` — so every message of the batch
being yielded, the ones not yet handed to the group included, stays invisible however long the
generator waits; no receive is sent meanwhile, so nothing more is taken. One limit is SQS's own: a
message's visibility cannot be extended past 12 hours after it was received. A message held longer
than that (a group paused for half a day) becomes visible again: SQS redelivers it (to this group
once it polls again, or to another consumer) and, when the held copy is finally advanced, its delete
fails on the stale receipt handle and is logged: a duplicate, never a loss.
``tests/adapters/sqs/test_sqs_suspended.py`` suspends a group for four visibility timeouts and
checks nothing came back.

Identity and messages: :meth:`SqsStreamProducer.get_event_id` is the ``MessageId``
(docs/concepts.md#redelivery-memory), so a copy redelivered after a release is handed only to the
subscribers that did not ack it. :meth:`SqsStreamProducer.to_message` builds the
:class:`~ackgate.Message` a :class:`~ackgate.Service` handler gets: ``body`` is the ``Body`` string
encoded as UTF-8, ``key`` the ``MessageGroupId`` (FIFO queues and fair queues) as UTF-8 bytes or
``None``, ``headers`` the *message* attributes (``String``/``Number`` types as their UTF-8 string
value, ``Binary`` as its bytes; custom ``String.x`` / ``Number.x`` / ``Binary.x`` types alike),
``id`` the ``MessageId``, ``attempt`` the ``ApproximateReceiveCount``. System attributes
(``SentTimestamp``, ``SenderId``, ...) are not headers: they describe the delivery, not the message,
and stay in ``message.raw["Attributes"]``.

Per-entry failures of a batch
call are retried, then logged on ``ackgate.adapters.sqs`` with the message ids; an
expired receipt handle is logged, never fatal (SQS redelivers the message). Errors
of a whole call propagate: from polling they end the group, from ``advance`` they
end it with ``AdvanceFailed``. Message bodies are never logged.

Outages: a receive that cannot reach SQS does not end the group. The first failure
is reported (``upstream_lost``: one WARNING on ``ackgate.upstream`` naming the queue
URL and the error, ``GroupStats.upstream_connected`` false), the receive is retried
after 1 s, doubling to 30 s, and the first that succeeds reports the queue back
(one INFO). Messages received before the outage stay held (the heartbeat keeps
trying, quietly); one whose visibility lapses meanwhile is redelivered. A delete
or release that cannot reach SQS is not retried and does not end the group: it is
logged at INFO with the message ids, and SQS redelivers those messages once their
visibility lapses (a duplicate, never a loss).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import AsyncExitStack
from typing import Any

from ackgate import (
    AdvanceItem,
    AdvanceOutcome,
    BrokerLag,
    Message,
    SharedStreamProducer,
    check_options,
    masked_options,
)
from ackgate_sqs._batches import BATCH_LIMIT, Coalescer, chunks, failed_ids, submit
from ackgate_sqs._dead_letter import dead_letter
from ackgate_sqs._errors import create_client, refusal, unreachable
from ackgate_sqs._lag import QueueCounts
from ackgate_sqs._message import Receipt, to_message

logger = logging.getLogger("ackgate.adapters.sqs")

#: Seconds before the first retry of a receive that could not reach SQS; doubled per
#: failed retry up to the maximum.
_RETRY_BACKOFF = 1.0
_MAX_RETRY_BACKOFF = 30.0
#: Seconds past its ``WaitTimeSeconds`` that closing still waits for a receive in
#: flight. SQS answers a long poll when its wait runs out, so a receive still
#: unanswered this long after that is stuck on the network, and its poll on the
#: server is over: releasing can no longer feed it.
_RECEIVE_GRACE = 5.0


class SqsStreamProducer(SharedStreamProducer):
    """Shared poll of one SQS queue; see the module docstring for the broker contract.

    ``queue_url`` may name a standard or a FIFO queue. ``max_messages`` (1-10) and
    ``wait_time_seconds`` (0-20) shape each ``ReceiveMessage`` long poll;
    ``visibility_timeout`` (seconds) is requested on every receive and renewed by
    the heartbeat every quarter of it. ``dlq_queue_url`` dead-letters rejected
    messages explicitly (a FIFO DLQ keeps the original group id and is
    deduplicated by the original message id). Credentials, region and retries come
    the usual botocore ways; ``client_options`` go to ``create_client`` (e.g.
    ``config=botocore.config.Config(...)``).

    No message is made visible while a long poll of this producer is in flight:
    a release waits for it to return (at once on a busy queue, at most
    ``wait_time_seconds`` on an idle one). SQS keeps a poll open server-side
    even after the client hung up and answers it with a message made visible
    meanwhile; at a stop that is a receive counted (``Message.attempt``,
    ``give_up_after``, a redrive policy's ``maxReceiveCount``) that no handler
    sees. Closing (:meth:`aclose`) sends no more receives, waits for the one in
    flight, makes every message received but not advanced (what that last poll
    returned included) visible again so it is redelivered at once, then closes
    the client. Closing therefore takes up to ``wait_time_seconds``.
    """

    messaging_system = "aws_sqs"

    def __init__(
        self,
        queue_url: str,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        max_messages: int = 10,
        wait_time_seconds: int = 20,
        visibility_timeout: int = 120,
        dlq_queue_url: str | None = None,
        **client_options: Any,
    ) -> None:
        if not queue_url:
            raise ValueError("queue_url must name a queue")
        if not 1 <= max_messages <= BATCH_LIMIT:
            raise ValueError(f"max_messages must be within 1..10, got {max_messages!r}")
        if not 0 <= wait_time_seconds <= 20:
            raise ValueError(f"wait_time_seconds must be within 0..20, got {wait_time_seconds!r}")
        if not 1 <= visibility_timeout <= 43_200:
            raise ValueError(
                f"visibility_timeout must be within 1..43200, got {visibility_timeout!r}"
            )
        if client_options:
            # A misspelt option would otherwise fail every restart, inside the stream.
            check_options(client_options, create_client(), what="aiobotocore create_client")
        self._queue_url = queue_url
        self._fifo = queue_url.endswith(".fifo")
        self._dlq_url = dlq_queue_url
        self._max_messages = max_messages
        self._wait = wait_time_seconds
        self._visibility = visibility_timeout
        self._client_args: dict[str, Any] = {
            "region_name": region_name,
            "endpoint_url": endpoint_url,
            **client_options,
        }
        self._stack: AsyncExitStack | None = None
        self._client: Any = None
        # Received and not yet advanced, by receipt handle: exactly what the
        # heartbeat keeps invisible and what aclose() hands back to the queue.
        self._outstanding: dict[str, Receipt] = {}
        # Held around every visibility change so a heartbeat extension can never
        # land after (and undo) the visibility 0 of a failed message.
        self._visibility_lock = asyncio.Lock()
        self._deletes = Coalescer(self._delete)
        self._releases = Coalescer(self._release)
        self._heartbeat: asyncio.Task[None] | None = None
        self._receiving: asyncio.Task[list[tuple[dict[str, Any], Receipt]]] | None = None
        # Loop time by which SQS answers the receive in flight (its long poll's end).
        self._receive_ends = 0.0
        # True while SQS may hold a ReceiveMessage of ours open (sent, or cancelled
        # by someone else, until aclose() waits it out); turned on only under
        # _visibility_lock. Invariant: no release is in flight meanwhile. SQS answers
        # a long poll with any message made visible while it waits, even after the
        # client hung up: at a stop, a receive counted (ApproximateReceiveCount, read
        # by give_up_after and maxReceiveCount) that no handler saw. So a release
        # waits in _held for the poll to end, at most wait_time_seconds (on a busy
        # queue polls return at once). Tests: test_sqs_producer.py's
        # test_a_release_*, test_a_receive_cancelled_by_someone_else_*; and
        # test_a_call_failing_during_a_stop_costs_its_message_no_receive_no_handler_saw.
        self._polling = False
        # Releases asked for while polling; still in _outstanding, so the heartbeat
        # keeps them invisible and aclose() finds them. Sent when the poll ends.
        self._held: list[Receipt] = []
        # Set by aclose(). Invariant: once set, no receive is sent.
        self._closing = False
        self._counts: QueueCounts | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Long-poll the queue forever, yielding ``(message, receipt)``.

        A receive that cannot reach SQS (a connection error, a timeout, an HTTP 5xx,
        after botocore's own retries) is reported with ``upstream_lost`` and retried
        after a backoff (1 s doubling to 30 s) until one succeeds (``upstream_back``):
        the group stays up through an outage. Any other receive error propagates
        and ends the group. Cancellation does not
        cancel a long poll in flight: :meth:`aclose` awaits it and releases
        whatever it received.
        """
        await self._connect()
        self._counts = QueueCounts(self._client, self._queue_url)
        self._counts.start()
        self._heartbeat = asyncio.create_task(self._keep_invisible(), name="ackgate-sqs-heartbeat")
        backoff = _RETRY_BACKOFF
        while not self._closing:
            self._receiving = asyncio.create_task(self._receive(), name="ackgate-sqs-receive")
            try:
                received = await asyncio.shield(self._receiving)
            except Exception as exc:
                refused = refusal(exc, self._queue_url)
                if refused is not None:
                    raise refused from exc
                if not unreachable(exc):
                    raise
                # An outage: said once (the core logs it), retried until SQS answers.
                self.upstream_lost(self._queue_url, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_RETRY_BACKOFF)
                continue
            backoff = _RETRY_BACKOFF
            self.upstream_back()
            for pair in received:
                yield pair

    def __repr__(self) -> str:
        return (
            f"<SqsStreamProducer queue_url={self._queue_url!r} dlq_queue_url={self._dlq_url!r} "
            f"options={masked_options(self._client_args)!r}>"
        )

    def broker_lag(self) -> BrokerLag | None:
        """The queue's approximate counts (``waiting``: visible, ``in_flight``: not
        visible), read every 10 s (:mod:`ackgate_sqs._lag`); ``None`` before the first."""
        return None if self._counts is None else self._counts.last

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        receipt: Receipt = broker_payload
        return receipt.lane

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        """The ``MessageId``: the same for every receive of one message
        (docs/concepts.md#redelivery-memory)."""
        receipt: Receipt = broker_payload
        return receipt.message_id

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """The :class:`~ackgate.Message` of one received message (see the module docstring)."""
        return to_message(raw_event, broker_payload)

    def destination_name(self) -> str:
        """What it reads, for spans' ``messaging.destination.name``."""
        return self._queue_url

    def dead_letter_destination(self) -> str | None:
        """``"SQS queue <dlq_queue_url>"``; ``None`` without ``dlq_queue_url``: a
        rejected message is then released, and only the queue's redrive policy (if
        any) ever moves it, after ``maxReceiveCount`` receives."""
        return None if self._dlq_url is None else f"SQS queue {self._dlq_url}"

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Delete, dead-letter or release each message (see the module docstring).

        Per-entry failures are logged, not raised: the message is then left to
        SQS redelivery. A failing call (network, permissions, a missing DLQ)
        raises. Cancellation leaves the rest of the batch to SQS redelivery.
        """
        delete: list[Receipt] = []
        release: list[Receipt] = []
        dead: list[tuple[Receipt, AdvanceOutcome]] = []
        for item in batch:
            receipt: Receipt = item.broker_payload
            outcome = item.outcome
            self._outstanding.pop(receipt.handle, None)
            if outcome.is_clean:
                delete.append(receipt)
            elif outcome.failed == 0 and outcome.rejected and self._dlq_url is not None:
                dead.append((receipt, outcome))
            else:
                release.append(receipt)
        if dead:
            assert self._dlq_url is not None  # dead-lettered only with a DLQ
            sent, unsent = await dead_letter(
                self._client, self._dlq_url, dead, source_url=self._queue_url
            )
            delete.extend(sent)
            release.extend(unsent)
        await self._deletes.submit(delete)
        await self._releases.submit(release)

    async def aclose(self) -> None:
        """Send no more receives, wait for the one in flight, then release every
        message received and not advanced (what that last poll returned
        included), and close the client.

        Nothing is made visible while the poll is in flight: SQS would answer it
        with the message, a receive counted for no handler (see ``_polling``).
        The heartbeat keeps going until then, since a lapsed visibility would feed
        the poll the same way. The wait is bounded: SQS answers a poll
        ``wait_time_seconds`` after it was sent at the latest; one still
        unanswered 5 s later is abandoned (its poll on the server is over by then).

        A receive cancelled by someone else (the event loop torn down) is waited
        out the same way: SQS keeps its poll open after the client hung up.

        Cancellation abandons the wait and releases nothing more: the held
        messages come back once their visibility lapses, with no receive counted
        that no handler saw. The client is closed regardless.
        """
        self._closing = True
        loop = asyncio.get_running_loop()
        try:
            receiving = self._receiving
            if receiving is not None:
                over = self._receive_ends + _RECEIVE_GRACE  # SQS's poll is over by then
                if not receiving.done():
                    await asyncio.wait([receiving], timeout=max(0.0, over - loop.time()))
                    receiving.cancel()  # no-op if it returned; else abandoned, see above
                    await asyncio.wait([receiving])
                elif self._polling:
                    # Cancelled by someone else (the loop torn down, every task
                    # cancelled at once): the client hung up, SQS's poll is still open.
                    await asyncio.sleep(max(0.0, over - loop.time()))
                self._polling = False
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                await asyncio.wait([self._heartbeat])
            if self._counts is not None:
                await self._counts.close()
            abandoned = list(self._outstanding.values())  # the held releases too
            self._outstanding.clear()
            self._held.clear()
            if abandoned and self._client is not None:
                await self._release(abandoned)
        finally:
            if self._receiving is not None:
                self._receiving.cancel()
            if self._stack is not None:
                await self._stack.aclose()

    async def _connect(self) -> None:
        try:
            from aiobotocore.session import get_session
        except ImportError as exc:
            raise ImportError("ackgate-sqs needs aiobotocore: pip install 'ackgate[sqs]'") from exc
        self._stack = AsyncExitStack()
        self._client = await self._stack.enter_async_context(
            get_session().create_client("sqs", **self._client_args)
        )

    async def _receive(self) -> list[tuple[dict[str, Any], Receipt]]:
        """One long poll; then the releases held while it was in flight."""
        async with self._visibility_lock:  # waits for a release in flight
            self._polling = True
        sent_at = asyncio.get_running_loop().time()
        self._receive_ends = sent_at + self._wait
        try:
            response = await self._client.receive_message(
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=self._max_messages,
                WaitTimeSeconds=self._wait,
                VisibilityTimeout=self._visibility,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        except asyncio.CancelledError:
            # _polling stays set: SQS keeps the poll open whoever hung up, so
            # releases stay held; aclose() waits the poll out, then releases them.
            raise
        except Exception:
            self._polling = False
            await self._release_held()
            raise
        self._polling = False
        received = []
        for message in response.get("Messages", ()):
            lane = message["Attributes"]["MessageGroupId"] if self._fifo else message["MessageId"]
            receipt = Receipt(message, lane, sent_at + self._visibility)
            # Registered here, not at yield: if polling stops first, aclose() still
            # finds the message and releases it.
            self._outstanding[receipt.handle] = receipt
            received.append((message, receipt))
        await self._release_held()
        return received

    async def _keep_invisible(self) -> None:
        """Every quarter timeout, extend whatever lapses within half a timeout."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._visibility / 4)
            horizon = loop.time() + self._visibility / 2
            due = [r for r in self._outstanding.values() if r.deadline <= horizon]
            try:
                for chunk in chunks(due):
                    await self._extend(chunk)
            except Exception as exc:
                # A failed call must not stop the heartbeat; the next tick retries,
                # and at worst the message is redelivered (a duplicate, no loss).
                if unreachable(exc):
                    self.upstream_lost(self._queue_url, exc)  # once per outage
                else:
                    logger.warning("SQS visibility heartbeat call failed", exc_info=True)

    async def _extend(self, chunk: Sequence[Receipt]) -> None:
        async with self._visibility_lock:
            # advance() may have taken some of them while we waited for the lock.
            live = [r for r in chunk if r.handle in self._outstanding]
            if not live:
                return
            sent_at = asyncio.get_running_loop().time()
            failures = await submit(
                self._client.change_message_visibility_batch,
                self._queue_url,
                live,
                lambda r: {"ReceiptHandle": r.handle, "VisibilityTimeout": self._visibility},
            )
        failed = {id(r) for r, _ in failures}
        for receipt in live:
            if id(receipt) not in failed:
                receipt.deadline = sent_at + self._visibility
        # A message advanced (deleted) during the call fails harmlessly.
        lost = [(r, code) for r, code in failures if r.handle in self._outstanding]
        if lost:
            logger.warning(
                "SQS could not extend visibility of message ids %s; "
                "they may be redelivered while still being handled",
                failed_ids(lost),
            )

    async def _delete(self, receipts: Sequence[Receipt]) -> None:
        for chunk in chunks(receipts):
            try:
                failures = await submit(
                    self._client.delete_message_batch,
                    self._queue_url,
                    chunk,
                    lambda r: {"ReceiptHandle": r.handle},
                )
            except Exception as exc:
                if not self._unreachable_while(exc, "delete", receipts):
                    raise
                return
            if failures:
                logger.warning(
                    "SQS delete failed for message ids %s; SQS will redeliver them",
                    failed_ids(failures),
                )

    async def _release_held(self) -> None:
        held, self._held = self._held, []
        for receipt in held:
            # Out before the release: the heartbeat must not extend it afterwards.
            self._outstanding.pop(receipt.handle, None)
        await self._release(held)

    async def _release(self, receipts: Sequence[Receipt]) -> None:
        for chunk in chunks(receipts):
            try:
                async with self._visibility_lock:
                    if self._polling:  # see _polling: sent once the poll has ended
                        self._held.extend(chunk)
                        self._outstanding.update((r.handle, r) for r in chunk)
                        continue
                    failures = await submit(
                        self._client.change_message_visibility_batch,
                        self._queue_url,
                        chunk,
                        lambda r: {"ReceiptHandle": r.handle, "VisibilityTimeout": 0},
                    )
            except Exception as exc:
                if not self._unreachable_while(exc, "release", receipts):
                    raise
                return
            if failures:
                logger.warning(
                    "SQS could not make message ids %s visible; "
                    "they return once their visibility timeout lapses",
                    failed_ids(failures),
                )

    def _unreachable_while(self, error: Exception, what: str, receipts: Sequence[Receipt]) -> bool:
        """A delete or release that could not reach SQS is not retried: its messages
        are no longer kept invisible, so SQS redelivers them once their visibility
        lapses (a duplicate, never a loss), and the group stays up. Returns False for
        any other error, which the caller raises."""
        if not unreachable(error):
            return False
        self.upstream_lost(self._queue_url, error)
        logger.info(
            "SQS %s of message ids %s could not reach SQS; they are redelivered once "
            "their visibility timeout lapses",
            what,
            [r.message_id for r in receipts],
        )
        return True
