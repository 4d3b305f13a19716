"""Amazon SQS adapter on aiobotocore: ``pip install 'ackgate[sqs]'``.

:class:`SqsStreamProducer` long-polls one queue and yields every received message
as the raw event: the message ``dict`` exactly as botocore returns it (``Body``,
``MessageId``, ``Attributes`` with every system attribute, ``MessageAttributes``).

What each outcome does to the broker (:meth:`SqsStreamProducer.advance`):

* clean (acked by everyone, nobody failed or rejected) → ``DeleteMessageBatch``;
* any subscriber failed, or nobody was subscribed → visibility 0, so SQS
  redelivers it at once;
* rejected (and nobody failed) → with ``dlq_queue_url``: sent to that queue
  (original body and message attributes plus ``ackgate.reason``: "rejected by R of N
  subscribers", then each reason given (SPEC §8, ``"<subscriber_id>: <reason>"``),
  separated by ``"; "``, at most 4096 characters), then deleted;
  without it: visibility 0, and the queue's own redrive policy moves it to its
  dead-letter queue once ``maxReceiveCount`` receives are used up. A queue with
  no redrive policy and no ``dlq_queue_url`` redelivers a rejected message forever.

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

Suspended at a ``yield`` (SPEC §10: backpressure, a paused rostered group). The
heartbeat is a task of its own, not part of the poll, and a message counts as held
from the moment ``ReceiveMessage`` returns it — not from its ``yield`` — so every
message of the batch being yielded, the ones not yet handed to the group included,
stays invisible however long the generator waits; no receive is sent meanwhile, so
nothing more is taken. One limit is SQS's own: a message's visibility cannot be
extended past 12 hours after it was received. A message held longer than that
(a group paused for half a day) becomes visible again: SQS redelivers it (to this
group once it polls again, or to another consumer) and, when the held copy is
finally advanced, its delete fails on the stale receipt handle and is logged: a
duplicate, never a loss. ``tests/adapters/sqs/test_sqs_suspended.py`` suspends a
group for four visibility timeouts and checks nothing came back.

Identity and messages: :meth:`SqsStreamProducer.get_event_id` is the ``MessageId``
(SPEC §13), so a copy redelivered after a release is handed only to the subscribers
that did not ack it. :meth:`SqsStreamProducer.to_message` builds the
:class:`~ackgate.Message` a :class:`~ackgate.Service` handler gets: ``body`` is the
``Body`` string encoded as UTF-8, ``key`` the ``MessageGroupId`` (FIFO queues and
fair queues) as UTF-8 bytes or ``None``, ``headers`` the *message* attributes
(``String``/``Number`` types as their UTF-8 string value, ``Binary`` as its bytes;
custom ``String.x`` / ``Number.x`` / ``Binary.x`` types alike), ``id`` the
``MessageId``, ``attempt`` the ``ApproximateReceiveCount``. System attributes
(``SentTimestamp``, ``SenderId``, ...) are not headers: they describe the delivery,
not the message, and stay in ``message.raw["Attributes"]``.

Per-entry failures of a batch
call are retried, then logged on ``ackgate.adapters.sqs`` with the message ids; an
expired receipt handle is logged, never fatal (SQS redelivers the message). Errors
of a whole call propagate: from polling they end the group, from ``advance`` they
end it with ``AdvanceFailed``. Message bodies are never logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from ackgate import AdvanceItem, AdvanceOutcome, Message, SharedStreamProducer

logger = logging.getLogger("ackgate.adapters.sqs")

REASON_ATTRIBUTE = "ackgate.reason"
"""Message attribute naming why a message was dead-lettered through ``dlq_queue_url``."""

_BATCH_LIMIT = 10  # SQS takes at most ten entries per batch call
_REASON_LIMIT = 4096  # characters of ackgate.reason
_ATTEMPTS = 3
_RETRY_DELAY = 0.2
# Entry codes meaning the receipt handle no longer names an in-flight message:
# retrying cannot help, and SQS redelivers the message on its own.
_STALE_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)

_BatchCall = Callable[..., Awaitable[dict[str, Any]]]


@dataclass(eq=False, slots=True)
class _Receipt:
    """The broker payload of one received message (opaque to ackgate)."""

    message: dict[str, Any]
    lane: str
    deadline: float
    """Loop time by which the visibility lapses, counted from *before* the call that
    set it, so it errs early. Only the heartbeat moves it."""

    @property
    def message_id(self) -> str:
        return str(self.message["MessageId"])

    @property
    def handle(self) -> str:
        return str(self.message["ReceiptHandle"])


def _chunks(receipts: Sequence[_Receipt]) -> Iterator[Sequence[_Receipt]]:
    for start in range(0, len(receipts), _BATCH_LIMIT):
        yield receipts[start : start + _BATCH_LIMIT]


def _attribute_bytes(value: dict[str, Any]) -> bytes:
    """A message attribute's value: ``Binary`` types as they are, the others UTF-8."""
    if str(value.get("DataType", "")).startswith("Binary"):
        return bytes(value.get("BinaryValue", b""))
    return str(value.get("StringValue", "")).encode()


def _with_reasons(summary: str, outcome: AdvanceOutcome) -> str:
    """``summary``, then the rejecting subscribers' reasons (SPEC §8), capped in length."""
    text = "; ".join((summary, *outcome.reasons))
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 3] + "..."


def _ids(failures: Sequence[tuple[_Receipt, str]]) -> str:
    return ", ".join(f"{receipt.message_id} ({code})" for receipt, code in failures)


class _Coalescer:
    """Merges the messages of concurrent :meth:`SqsStreamProducer.advance` calls
    into batch calls of up to ten.

    On a standard queue every message is its own lane, so each advance carries a
    single message; with ``max_concurrent_advances`` above 1 the advances running
    at the same time share one batch call instead of paying one request each.
    A caller returns once its own messages were sent; an error of the call they
    shared is raised in every caller.
    """

    def __init__(self, send: Callable[[Sequence[_Receipt]], Awaitable[None]]) -> None:
        self._send = send
        self._waiting: list[tuple[_Receipt, asyncio.Future[None]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def submit(self, receipts: Sequence[_Receipt]) -> None:
        if not receipts:
            return
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in receipts]
        self._waiting.extend(zip(receipts, futures, strict=True))
        if self._sender is None:
            self._sender = loop.create_task(self._send_waiting())
        await asyncio.gather(*futures)

    async def _send_waiting(self) -> None:
        try:
            await asyncio.sleep(0)  # let the advances started in this pass join in
            while self._waiting:
                chunk = self._waiting[:_BATCH_LIMIT]
                del self._waiting[:_BATCH_LIMIT]
                try:
                    await self._send([receipt for receipt, _ in chunk])
                except Exception as exc:
                    for _, future in chunk:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for _, future in chunk:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._sender = None
            # Only reached with messages left if this task was cancelled (loop
            # shutdown): their advances must not wait forever.
            for _, future in self._waiting:
                future.cancel()
            self._waiting.clear()


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

    Closing (:meth:`aclose`) stops the heartbeat, lets a long poll already sent
    finish (SQS keeps it open server-side even if the client hangs up, hiding
    what it picks up for ``visibility_timeout``), makes every message that was
    received but not advanced visible again so it is redelivered at once, then
    closes the client. Closing therefore takes up to ``wait_time_seconds``.
    """

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
        if not 1 <= max_messages <= _BATCH_LIMIT:
            raise ValueError(f"max_messages must be within 1..10, got {max_messages!r}")
        if not 0 <= wait_time_seconds <= 20:
            raise ValueError(f"wait_time_seconds must be within 0..20, got {wait_time_seconds!r}")
        if not 1 <= visibility_timeout <= 43_200:
            raise ValueError(
                f"visibility_timeout must be within 1..43200, got {visibility_timeout!r}"
            )
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
        self._outstanding: dict[str, _Receipt] = {}
        # Held around every visibility change so a heartbeat extension can never
        # land after (and undo) the visibility 0 of a failed message.
        self._visibility_lock = asyncio.Lock()
        self._deletes = _Coalescer(self._delete)
        self._releases = _Coalescer(self._release)
        self._heartbeat: asyncio.Task[None] | None = None
        self._receiving: asyncio.Task[list[tuple[dict[str, Any], _Receipt]]] | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Long-poll the queue forever, yielding ``(message, receipt)``.

        A receive error propagates and ends the group. Cancellation does not
        cancel a long poll in flight: :meth:`aclose` awaits it and releases
        whatever it received.
        """
        await self._connect()
        self._heartbeat = asyncio.create_task(self._keep_invisible(), name="ackgate-sqs-heartbeat")
        while True:
            self._receiving = asyncio.create_task(self._receive(), name="ackgate-sqs-receive")
            for pair in await asyncio.shield(self._receiving):
                yield pair

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        receipt: _Receipt = broker_payload
        return receipt.lane

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        """The ``MessageId``: the same for every receive of one message (SPEC §13)."""
        receipt: _Receipt = broker_payload
        return receipt.message_id

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """The :class:`~ackgate.Message` of one received message (see the module docstring)."""
        receipt: _Receipt = broker_payload
        message: dict[str, Any] = raw_event
        system = message.get("Attributes", {})
        group = system.get("MessageGroupId")
        count = system.get("ApproximateReceiveCount")
        return Message(
            body=str(message.get("Body", "")).encode(),
            key=None if group is None else str(group).encode(),
            headers={
                name: _attribute_bytes(value)
                for name, value in message.get("MessageAttributes", {}).items()
            },
            id=receipt.message_id,
            lane=receipt.lane,
            attempt=None if count is None else int(count),
            raw=message,
        )

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Delete, dead-letter or release each message (see the module docstring).

        Per-entry failures are logged, not raised: the message is then left to
        SQS redelivery. A failing call (network, permissions, a missing DLQ)
        raises. Cancellation leaves the rest of the batch to SQS redelivery.
        """
        delete: list[_Receipt] = []
        release: list[_Receipt] = []
        dead: list[tuple[_Receipt, AdvanceOutcome]] = []
        for item in batch:
            receipt: _Receipt = item.broker_payload
            outcome = item.outcome
            self._outstanding.pop(receipt.handle, None)
            if outcome.is_clean:
                delete.append(receipt)
            elif outcome.failed == 0 and outcome.rejected and self._dlq_url is not None:
                dead.append((receipt, outcome))
            else:
                release.append(receipt)
        if dead:
            sent, unsent = await self._dead_letter(dead)
            delete.extend(sent)
            release.extend(unsent)
        await self._deletes.submit(delete)
        await self._releases.submit(release)

    async def aclose(self) -> None:
        """Stop the heartbeat, release what was never advanced, close the client.

        Cancellation abandons the wait for a pending long poll; the client is
        closed regardless.
        """
        try:
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                await asyncio.wait([self._heartbeat])
            if self._receiving is not None:
                await asyncio.wait([self._receiving])
            abandoned = list(self._outstanding.values())
            self._outstanding.clear()
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

    async def _receive(self) -> list[tuple[dict[str, Any], _Receipt]]:
        sent_at = asyncio.get_running_loop().time()
        response = await self._client.receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=self._max_messages,
            WaitTimeSeconds=self._wait,
            VisibilityTimeout=self._visibility,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        received = []
        for message in response.get("Messages", ()):
            lane = message["Attributes"]["MessageGroupId"] if self._fifo else message["MessageId"]
            receipt = _Receipt(message, lane, sent_at + self._visibility)
            # Registered here, not at yield: if polling stops first, aclose() still
            # finds the message and releases it.
            self._outstanding[receipt.handle] = receipt
            received.append((message, receipt))
        return received

    async def _keep_invisible(self) -> None:
        """Every quarter timeout, extend whatever lapses within half a timeout."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._visibility / 4)
            horizon = loop.time() + self._visibility / 2
            due = [r for r in self._outstanding.values() if r.deadline <= horizon]
            try:
                for chunk in _chunks(due):
                    await self._extend(chunk)
            except Exception:
                # A failed call must not stop the heartbeat; the next tick retries,
                # and at worst the message is redelivered (a duplicate, no loss).
                logger.warning("SQS visibility heartbeat call failed", exc_info=True)

    async def _extend(self, chunk: Sequence[_Receipt]) -> None:
        async with self._visibility_lock:
            # advance() may have taken some of them while we waited for the lock.
            live = [r for r in chunk if r.handle in self._outstanding]
            if not live:
                return
            sent_at = asyncio.get_running_loop().time()
            failures = await self._submit(
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
                _ids(lost),
            )

    async def _delete(self, receipts: Sequence[_Receipt]) -> None:
        for chunk in _chunks(receipts):
            failures = await self._submit(
                self._client.delete_message_batch,
                self._queue_url,
                chunk,
                lambda r: {"ReceiptHandle": r.handle},
            )
            if failures:
                logger.warning(
                    "SQS delete failed for message ids %s; SQS will redeliver them",
                    _ids(failures),
                )

    async def _release(self, receipts: Sequence[_Receipt]) -> None:
        for chunk in _chunks(receipts):
            async with self._visibility_lock:
                failures = await self._submit(
                    self._client.change_message_visibility_batch,
                    self._queue_url,
                    chunk,
                    lambda r: {"ReceiptHandle": r.handle, "VisibilityTimeout": 0},
                )
            if failures:
                logger.warning(
                    "SQS could not make message ids %s visible; "
                    "they return once their visibility timeout lapses",
                    _ids(failures),
                )

    async def _dead_letter(
        self, dead: Sequence[tuple[_Receipt, AdvanceOutcome]]
    ) -> tuple[list[_Receipt], list[_Receipt]]:
        """Send rejected messages to the DLQ; return (sent, not sent)."""
        dlq_url = self._dlq_url
        assert dlq_url is not None  # advance() dead-letters only with a DLQ
        reasons = {
            id(receipt): _with_reasons(
                f"rejected by {o.rejected} of {o.acked + o.rejected} subscribers", o
            )
            for receipt, o in dead
        }
        receipts = [receipt for receipt, _ in dead]
        unsent: list[_Receipt] = []
        for chunk in _chunks(receipts):
            failures = await self._submit(
                self._client.send_message_batch,
                dlq_url,
                chunk,
                lambda r: self._dead_letter_entry(r, reasons[id(r)]),
            )
            if failures:
                logger.error(
                    "SQS could not send message ids %s to the dead-letter queue; "
                    "releasing them for redelivery",
                    _ids(failures),
                )
                unsent.extend(r for r, _ in failures)
        failed = {id(r) for r in unsent}
        return [r for r in receipts if id(r) not in failed], unsent

    def _dead_letter_entry(self, receipt: _Receipt, reason: str) -> dict[str, Any]:
        message = receipt.message
        attributes = {
            name: {
                key: value[key]
                for key in ("DataType", "StringValue", "BinaryValue")
                if key in value
            }
            for name, value in message.get("MessageAttributes", {}).items()
        }
        attributes[REASON_ATTRIBUTE] = {"DataType": "String", "StringValue": reason}
        entry: dict[str, Any] = {"MessageBody": message["Body"], "MessageAttributes": attributes}
        if str(self._dlq_url).endswith(".fifo"):
            group = message.get("Attributes", {}).get("MessageGroupId", receipt.message_id)
            entry["MessageGroupId"] = group
            # A redelivered message that is rejected again is not dead-lettered twice.
            entry["MessageDeduplicationId"] = receipt.message_id
        return entry

    async def _submit(
        self,
        call: _BatchCall,
        queue_url: str,
        chunk: Sequence[_Receipt],
        entry: Callable[[_Receipt], dict[str, Any]],
    ) -> list[tuple[_Receipt, str]]:
        """Run one batch call (at most ten entries), retrying failed entries.

        Returns the entries that still failed, with their error codes. Stale
        receipt handles are not retried. A failing call raises.
        """
        pending = {str(index): receipt for index, receipt in enumerate(chunk)}
        failures: list[tuple[_Receipt, str]] = []
        for attempt in range(_ATTEMPTS):
            entries = [{"Id": key, **entry(r)} for key, r in pending.items()]
            response = await call(QueueUrl=queue_url, Entries=entries)
            errors = {e["Id"]: str(e.get("Code", "?")) for e in response.get("Failed", ())}
            retry = {}
            for key, code in errors.items():
                if code in _STALE_CODES or attempt == _ATTEMPTS - 1:
                    failures.append((pending[key], code))
                else:
                    retry[key] = pending[key]
            if not retry:
                break
            pending = retry
            await asyncio.sleep(_RETRY_DELAY * 2**attempt)
        return failures
