"""The dead-letter side of the Kafka producer: the copy of a rejected record
(docs/concepts.md#deferred-resolution reasons in a header), written once per process, a stub
when the record is too large for the DLQ, and permanent refusals that stop the service.

* **Once.** The ids ``(topic, partition, offset)`` of the records whose DLQ copy was
  acknowledged are remembered for the process's life (the 65,536 most recent per
  consumer group and DLQ topic, across the group lives of a service): a rejected
  record fetched again (a hold or a rebalance rewound its partition before the commit
  passed it) is not written again. Across a crash between the DLQ write and the
  commit it may be written once more: the DLQ is at-least-once across processes.
* **Too large.** A copy the DLQ refuses for its size (``MessageSizeTooLargeError``:
  aiokafka's ``max_request_size``, or the broker's ``max.message.bytes``) is replaced
  by a stub: an empty key, the ``ackgate.*`` headers and a JSON value naming the
  original topic, partition and offset, its size and the reason; one ERROR names the
  settings to raise (``dlq_producer_options={"max_request_size": ...}`` and the DLQ
  topic's ``max.message.bytes``). The record is then committed past as usual.
* **Refused for good.** A DLQ topic that does not exist or may not be written
  (``UnknownTopicOrPartitionError`` after the metadata wait, ``TopicAuthorizationFailed``,
  ``ClusterAuthorizationFailed``, ``InvalidTopic``) raises :class:`ackgate.PermanentError`:
  a ``Service`` does not restart its group, ``run()`` raises, and ``ackgate run``
  exits 1 with one line (docs/production.md#permanent-errors-and-exit-codes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ackgate import AdvanceOutcome, DeliveryCounts, PermanentError

log = logging.getLogger("ackgate.adapters.kafka")

# Connection-level options that the DLQ producer must share with the consumer, so a
# secured cluster is reached the same way by both.
SHARED_CONNECTION_OPTIONS = frozenset(
    {
        "client_id",
        "api_version",
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "sasl_oauth_token_provider",
        "connections_max_idle_ms",
        "request_timeout_ms",
        "metadata_max_age_ms",
        "retry_backoff_ms",
    }
)

#: DLQ copies remembered per (consumer group, DLQ topic) for the process's life.
_REMEMBERED = 65_536
_written: dict[tuple[str, str], DeliveryCounts] = {}

#: aiokafka errors that no retry mends: the DLQ topic is missing or refused to us.
_PERMANENT = (
    "UnknownTopicOrPartitionError",
    "TopicAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "InvalidTopicError",
)
_TOO_LARGE = ("MessageSizeTooLargeError", "RecordTooLargeError")


def reason(outcome: AdvanceOutcome, total: int) -> str:
    """The ``ackgate.reason`` header: the count, then the subscribers' reasons
    (docs/concepts.md#deferred-resolution)."""
    summary = f"rejected by {outcome.rejected} of {total} subscribers"
    return f"{summary}: {'; '.join(outcome.reasons)}" if outcome.reasons else summary


def _origin(record: Any, outcome: AdvanceOutcome) -> list[tuple[str, bytes]]:
    total = outcome.acked + outcome.failed + outcome.rejected
    return [
        ("ackgate.original.topic", record.topic.encode()),
        ("ackgate.original.partition", str(record.partition).encode()),
        ("ackgate.original.offset", str(record.offset).encode()),
        ("ackgate.reason", reason(outcome, total).encode()),
    ]


def dead_letter_headers(record: Any, outcome: AdvanceOutcome) -> list[tuple[str, bytes]]:
    """The record's own headers, then where it came from and why it was rejected."""
    return [*(record.headers or ()), *_origin(record, outcome)]


def record_size(record: Any) -> int:
    """Bytes of the record's key, value and headers (what the DLQ copy carries)."""
    headers = sum(len(name) + len(value or b"") for name, value in record.headers or ())
    return len(record.key or b"") + len(record.value or b"") + headers


def stub(record: Any, outcome: AdvanceOutcome, error: BaseException) -> tuple[bytes, list[Any]]:
    """The value and headers of the stub that stands for a record too large for the DLQ."""
    size = record_size(record)
    total = outcome.acked + outcome.failed + outcome.rejected
    value = json.dumps(
        {
            "ackgate_stub": "record too large for the dead-letter topic",
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "size": size,
            "reason": reason(outcome, total),
            "refused_with": f"{type(error).__name__}: {error}",
        }
    ).encode()
    headers = [*_origin(record, outcome), ("ackgate.stub", str(size).encode())]
    return value, headers


class DeadLetterWriter:
    """The DLQ writes of :class:`~ackgate_kafka.KafkaStreamProducer` (a mixin ahead of
    :class:`~ackgate_kafka._commits.PartitionOwner`, whose advance calls them)."""

    _group_id: str
    _dlq_topic: str | None
    _dlq: Any
    _errors: Any
    #: PartitionOwner's: the broker error as the RuntimeError/ConnectionError to raise.
    _translate: Callable[[BaseException, str], Exception]

    def _written_copies(self) -> DeliveryCounts:
        assert self._dlq_topic is not None
        key = (self._group_id, self._dlq_topic)
        written = _written.get(key)
        if written is None:
            written = _written[key] = DeliveryCounts(_REMEMBERED)
        return written

    async def _dead_letter_all(self, tp: Any, decided: Any) -> None:
        """Write the plan's rejected records to the DLQ, each once per process, and wait
        for every acknowledgement (without ``dlq_topic``: a WARNING per record, which is
        then committed past). Raises :class:`ackgate.PermanentError` for a refusal no
        retry mends, ``RuntimeError``/``ConnectionError`` for the others."""
        if self._dlq is None:
            for delivery, _ in decided.rejected:
                log.warning(
                    "Rejected event %s-%d@%d committed past without a DLQ (no dlq_topic)",
                    tp.topic,
                    tp.partition,
                    delivery.record.offset,
                )
            return
        written = self._written_copies()
        sent: list[tuple[tuple[str, int, int], Any, AdvanceOutcome, Any]] = []
        for delivery, outcome in decided.rejected:
            record = delivery.record
            ident = (record.topic, record.partition, record.offset)
            if written.get(ident):
                log.debug(
                    "Rejected event %s-%d@%d is in the DLQ already (fetched again): not "
                    "written twice",
                    *ident,
                )
                continue
            sent.append((ident, record, outcome, await self._send_dead_letter(record, outcome)))
        for ident, record, outcome, acknowledged in sent:
            try:
                await acknowledged
            except self._errors.KafkaError as exc:
                if type(exc).__name__ not in _TOO_LARGE:
                    raise self._refused(exc, record, decided.commit_to) from exc
                await (await self._stub(record, outcome, exc))
            written.add(ident)

    async def _send_dead_letter(self, record: Any, outcome: AdvanceOutcome) -> Any:
        """Queue the DLQ copy (a stub when aiokafka refuses it for its size); return the
        future of its acknowledgement."""
        headers = dead_letter_headers(record, outcome)
        try:
            return await self._dlq.send(
                self._dlq_topic, value=record.value, key=record.key, headers=headers
            )
        except self._errors.KafkaError as exc:
            if type(exc).__name__ in _TOO_LARGE:
                return await self._stub(record, outcome, exc)
            raise self._refused(exc, record, None) from exc

    async def _stub(self, record: Any, outcome: AdvanceOutcome, error: BaseException) -> Any:
        value, headers = stub(record, outcome, error)
        log.error(
            "Rejected event %s-%d@%d (%d bytes) is too large for the DLQ topic %s (%s): a "
            "stub naming it was written there instead. Raise max_request_size in "
            "KafkaStreamProducer(dlq_producer_options=...) and the DLQ topic's "
            "max.message.bytes to keep such records whole",
            record.topic,
            record.partition,
            record.offset,
            record_size(record),
            self._dlq_topic,
            type(error).__name__,
        )
        try:
            return await self._dlq.send(self._dlq_topic, value=value, headers=headers)
        except self._errors.KafkaError as exc:
            raise self._refused(exc, record, None) from exc

    def _refused(self, exc: BaseException, record: Any, commit_to: int | None) -> Exception:
        """Log a failed DLQ write; the exception to raise for it."""
        log.error(
            "DLQ write to %s failed for %s-%d@%d; not committing%s: %r",
            self._dlq_topic,
            record.topic,
            record.partition,
            record.offset,
            "" if commit_to is None else f" up to offset {commit_to}",
            exc,
        )
        if type(exc).__name__ in _PERMANENT:
            return PermanentError(
                f"the Kafka DLQ topic {self._dlq_topic!r} refuses writes for good "
                f"({type(exc).__name__}; group={self._group_id!r}): create the topic or grant "
                "this principal write access to it"
            )
        return self._translate(exc, "DLQ write failed")
