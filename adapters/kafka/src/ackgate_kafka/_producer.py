"""Kafka adapter: one aiokafka consumer per group, committed only past what all subscribers did.

Install with ``pip install 'ackgate[kafka]'``. :class:`KafkaStreamProducer` joins a Kafka
consumer group (auto-commit always off), yields every record as
``(record, delivery)`` where ``record`` is the ``aiokafka.ConsumerRecord`` (raw bytes
in ``key``/``value``), and commits offsets as ackgate reports events resolved.

What each outcome does to the broker, per partition (the lane is ``(topic, partition)``):

* **acked** by every subscriber: committed past.
* **rejected** by at least one subscriber (none failed): copied to ``dlq_topic`` with the
  original key, value and headers plus ``ackgate.original.topic``, ``ackgate.original.partition``,
  ``ackgate.original.offset`` and one ``ackgate.reason`` header, and committed past only after the
  DLQ write is acknowledged. ``ackgate.reason`` is ``"rejected by <r> of <n> subscribers"``,
  followed, when rejecting subscribers gave reasons (docs/concepts.md#deferred-resolution), by ``":
  "`` and their ``"<subscriber_id>: <reason>"`` entries joined with ``"; "`` (in subscription order;
  not escaped: for people and logs, not for parsing). Without ``dlq_topic`` it is committed past and
  a WARNING names its offset: the event is dropped on purpose. The DLQ is at-least-once too: if the
  partition is revoked between the DLQ write and the commit, the new owner redelivers the event and
  it may be dead-lettered again; within one process it is written once
  (:mod:`ackgate_kafka._dead_letter`: once, a stub for a record too large for the DLQ, and
  :class:`ackgate.PermanentError` for a DLQ topic missing or not writable).
* **failed** by any subscriber, or broadcast to **zero** subscribers: *held*. The
  partition is committed up to just before it and sought back to it, so this process
  fetches it (and everything after it) again. Nothing past a held offset is committed
  until a later delivery of it is acked or rejected.

One ``commit`` call per advance call, for the last committable offset. ackgate
advances this producer by runs (:meth:`~KafkaStreamProducer.advance_runs`): a run of
events all acked (no exceptions, all fetched in the partition's current epoch) is
committed past its last offset without looking at its events; a run with exceptions
is decided event by event (:mod:`ackgate_kafka._advance`), as ``advance`` decides its
items. Batches carry their ids as one :class:`ackgate.IdRange` when their offsets
have no gap.

The code: :mod:`ackgate_kafka._fetch` (the poll loop, chunks of a fetch),
:mod:`ackgate_kafka._advance` (what an advance decides), :mod:`ackgate_kafka._commits`
(ownership, commits, holds, the DLQ), :mod:`ackgate_kafka._partitions` (the state per
partition) and :mod:`ackgate_kafka._offset_map` (the commit metadata).

**The offset map** (:mod:`ackgate_kafka._offset_map`). Every commit's metadata records
the offsets past the committed one that already advanced clean (acked by every
subscriber, or rejected with the DLQ copy acknowledged: what a commit past them would
require) and how often the offsets from the committed one on were delivered. Clean
outcomes past a hold, and those of copies fetched before it (stale), are recorded as
*finished*: they are not yielded again when fetched again, and when the commit reaches
them it moves past them. While a hold keeps the commit in place, each ``advance`` that
finishes more offsets commits the same offset again with the new map, so a restart or
a new owner (which reads the map before yielding anything of the partition) does not
replay them. The map is bounded (4000 characters; the farthest runs are left out), and
a map that is missing, malformed, or written for another partition, topic or offset is
ignored (logged at INFO): only duplicates result.

**Attempts.** ``Message.attempt`` is the delivery count of the offset: counted for the
producer's life (one group life), and carried in the map for the offsets at and after
the committed one. Before yielding an offset delivered before, and before the first
records of an assignment, the producer commits the committed offset again with the
new counts, so a service that dies on a message (a crash loop) counts up on every start.
An offset that earlier lives delivered twice or more without finishing it is yielded
alone, and nothing after it until it is committed past: a crash loop then dies on that
offset only, and only its count goes up (``give_up_after`` can end the loop).

**Redelivery after a hold, and why nothing is committed twice or too far.** Every
yielded delivery carries the *epoch* of its partition at fetch time. Holding at
offset ``F`` seeks to ``F`` and starts a new epoch; deliveries of the old epoch that
ackgate still hands to :meth:`~KafkaStreamProducer.advance` afterwards (offsets above
``F``, already fetched before the seek) are skipped, because the seek fetches each of
them again under the new epoch. Subscribers therefore see those events twice
(at-least-once); the broker is committed once, by the new epoch's copies, in order.
A group whose subscribers are all force-failed keeps holding and refetching the same
offset until a subscriber resolves it or the group stops (logged once at INFO).

**Rebalance.** When partitions are revoked, records of those partitions are no longer
yielded; the revoke callback waits up to ``rebalance_drain_timeout`` seconds for the
events already yielded from them to be advanced and committed, then gives them up.
Advances that arrive for a partition this consumer no longer owns (or owned in an
earlier assignment) commit nothing and are logged at INFO: the new owner reads from
the last committed offset. Newly assigned partitions start from their committed
offset (``auto_offset_reset`` defaults to ``"earliest"`` for a group with no commit,
so nothing already in the topic is skipped; pass it to override).

**Suspended at a yield (docs/writing-an-adapter.md#1-the-producer).** Backpressure
(``overflow="block"``, ``max_outstanding``) or a paused rostered group can leave :meth:`open_stream`
suspended at a ``yield`` for any length of time, and aiokafka leaves the consumer group once no
``getmany`` has run for ``max_poll_interval_ms``. So a keeper task (one per producer,
:mod:`ackgate_kafka._membership`) watches the time since the stream's last ``getmany`` ended; past a
third of ``max_poll_interval_ms`` it pauses every assigned partition and calls ``getmany`` (200 ms
timeout) on the stream's behalf, which returns nothing but keeps the consumer in the group:
heartbeats, commits and rebalances go on as usual. Partitions assigned meanwhile are paused too;
records that arrive anyway are sought back to, so none is skipped. Before its next fetch the stream
wakes the keeper, waits for its ``getmany`` to return (never two at once) and the paused partitions
are resumed; records fetched before the suspension are yielded as usual (or dropped as stale if a
hold or revoke happened meanwhile, as above). The stream only checks the keeper once per fetch:
nothing is added per record. A poll error while keeping ends the group at the stream's next fetch,
as a poll error would. During a rebalance while suspended, the revoke drain still waits at most
``rebalance_drain_timeout`` for yielded events, which a paused group may not resolve in time: they
are then redelivered to the new owner.

**Identity and messages.** :meth:`~KafkaStreamProducer.get_event_id` is ``(topic, partition,
offset)``, so a copy fetched again after a hold is not handed to the subscribers that already acked
it (docs/concepts.md#redelivery-memory): only those that failed it (or joined since) see it twice.
:meth:`~KafkaStreamProducer.to_message` builds the ``ackgate.Message`` a ``Service`` handler
receives (tombstones, duplicate header names and the delivery count are described there).

**Lag and new partitions.** :meth:`~KafkaStreamProducer.broker_lag` is the end offset
minus the group's committed offset of every partition of the topics, measured every 5 s
(:mod:`ackgate_kafka._lag`). ``metadata_max_age_ms`` defaults to 20 s (aiokafka's own
default is 300 s), so partitions added to a topic are read within 30 s.

**Errors.** A broker error while starting or polling ends the group: subscribers get
``StreamTerminated`` whose ``__cause__`` is a ``ConnectionError`` (cannot reach the
cluster) or ``RuntimeError`` chained to the aiokafka error. A refusal is told apart
(:mod:`ackgate_kafka._refusals`): refused credentials and denied access raise
:class:`ackgate.AuthenticationFailed` ("authentication failed for user alice
(SCRAM-SHA-512)"), an untrusted broker certificate
:class:`ackgate.TLSVerificationFailed`, which a service does not retry unless made
with ``retry_on_auth_error``. A failed commit or DLQ
write is logged at ERROR with the partition and offset and raised, so the group ends
with ``AdvanceFailed`` and the broker redelivers everything not committed.

Logging is on ``ackgate.adapters.kafka`` and names topics, partitions and offsets,
never keys, values or headers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncGenerator, Hashable, Mapping, Sequence
from typing import Any

from ackgate import EventBatch, Message, check_options, masked_options
from ackgate_kafka._dead_letter import DeadLetterWriter
from ackgate_kafka._fetch import Fetcher, _import_aiokafka, event_ids
from ackgate_kafka._message import check_value, wrap, wrap_all
from ackgate_kafka._offset_map import MAX_METADATA

# An offset map this short still holds its header and a few runs.
_SMALLEST_MAP = 128

log = logging.getLogger("ackgate.adapters.kafka")

#: ``metadata_max_age_ms`` unless given: how soon new partitions of a topic are seen.
DEFAULT_METADATA_MAX_AGE_MS = 20_000


class KafkaStreamProducer(DeadLetterWriter, Fetcher):
    """Consume ``topics`` as consumer group ``group_id``; commit only what all subscribers resolved.

    ``consumer_options`` pass through to ``aiokafka.AIOKafkaConsumer`` (security
    protocol, SASL, ``ssl_context``, fetch sizes, ``max_poll_records``...); the
    connection-level ones are shared with the DLQ producer. ``dlq_producer_options``
    (with ``dlq_topic`` only) pass to the DLQ's ``aiokafka.AIOKafkaProducer`` over those,
    e.g. ``{"max_request_size": 10_485_760}`` for records above 1 MB (the default
    ``acks="all"`` may be overridden too). A name the consumer does not take is a
    ``TypeError`` here, naming the closest valid one. The ``repr`` shows the options
    with secrets (passwords, token providers) masked. ``enable_auto_commit=True``
    is refused with ``ValueError`` here, before any connection. With a ``dlq_topic``,
    key/value deserializers are refused too: the DLQ copy carries the original bytes.

    ``rebalance_drain_timeout`` (seconds, >= 0) bounds how long a revoke waits for the
    events already yielded from the revoked partitions to be advanced; keep it well
    below ``max_poll_interval_ms``, which bounds the whole rebalance.

    Outcomes, lanes, redelivery and logging are described in the module docstring.
    Nothing connects before :meth:`open_stream`; :meth:`aclose` stops the consumer
    (leaving the group) and the DLQ producer.
    """

    messaging_system = "kafka"

    def __init__(
        self,
        topics: str | Sequence[str],
        *,
        bootstrap_servers: str | Sequence[str],
        group_id: str,
        dlq_topic: str | None = None,
        dlq_producer_options: Mapping[str, Any] | None = None,
        rebalance_drain_timeout: float = 10.0,
        offset_map_max_bytes: int = MAX_METADATA,
        **consumer_options: Any,
    ) -> None:
        self._topics = [topics] if isinstance(topics, str) else list(topics)
        if not self._topics or not all(isinstance(t, str) and t for t in self._topics):
            raise ValueError("topics must name at least one topic")
        if not group_id:
            raise ValueError("group_id is required: commits belong to a consumer group")
        if consumer_options.pop("enable_auto_commit", False):
            raise ValueError(
                "enable_auto_commit=True is not supported: ackgate commits only what every "
                "subscriber resolved, and auto-commit would commit what they have not"
            )
        if dlq_topic is not None and (
            {"key_deserializer", "value_deserializer"} & consumer_options.keys()
        ):
            raise ValueError(
                "key_deserializer/value_deserializer cannot be combined with dlq_topic: the "
                "DLQ copy needs the original bytes; deserialize in the subscriber instead"
            )
        if dlq_producer_options is not None:
            if not isinstance(dlq_producer_options, Mapping):
                raise TypeError(
                    f"dlq_producer_options must be a mapping, got {dlq_producer_options!r}"
                )
            if dlq_topic is None:
                raise ValueError("dlq_producer_options apply to the DLQ producer: pass dlq_topic")
            if "bootstrap_servers" in dlq_producer_options:
                raise ValueError(
                    "dlq_producer_options cannot set bootstrap_servers: the DLQ topic is "
                    "on the consumer's cluster"
                )
        if rebalance_drain_timeout < 0:
            raise ValueError("rebalance_drain_timeout must be >= 0")
        if type(offset_map_max_bytes) is not int or offset_map_max_bytes < _SMALLEST_MAP:
            raise ValueError(
                f"offset_map_max_bytes must be an int >= {_SMALLEST_MAP} (Kafka's "
                "offset.metadata.max.bytes, 4096 by default, bounds it from above), "
                f"got {offset_map_max_bytes!r}"
            )
        if consumer_options:
            check_options(
                consumer_options,
                _import_aiokafka().AIOKafkaConsumer,
                what="aiokafka.AIOKafkaConsumer",
            )
        if dlq_producer_options:
            check_options(
                dlq_producer_options,
                _import_aiokafka().AIOKafkaProducer,
                what="aiokafka.AIOKafkaProducer (dlq_producer_options)",
            )
        consumer_options.setdefault("auto_offset_reset", "earliest")
        # aiokafka's default is 5 minutes: partitions added to a topic would wait that
        # long to be assigned and read.
        consumer_options.setdefault("metadata_max_age_ms", DEFAULT_METADATA_MAX_AGE_MS)
        self._bootstrap_servers = bootstrap_servers
        self._group_id = group_id
        self._dlq_topic = dlq_topic
        self._dlq_options = dict(dlq_producer_options or {})
        self._drain_timeout = rebalance_drain_timeout
        self._options = consumer_options
        self._consumer = None
        self._dlq = None
        self._errors = None
        self._partitions = {}
        self._epochs = itertools.count(1)
        self._lock = asyncio.Lock()
        self._progress = asyncio.Event()
        self._keeper = None
        self._map_max_bytes = offset_map_max_bytes

    def __repr__(self) -> str:
        return (
            f"<KafkaStreamProducer topics={self._topics!r} group_id={self._group_id!r} "
            f"bootstrap_servers={self._bootstrap_servers!r} dlq_topic={self._dlq_topic!r} "
            f"options={masked_options(self._options)!r} "
            f"dlq_producer_options={masked_options(self._dlq_options)!r}>"
        )

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        tp: Hashable = broker_payload.tp
        return tp

    def get_event_id(self, broker_payload: Any) -> Hashable:
        """``(topic, partition, offset)``: the same record however often it is fetched."""
        record = broker_payload.record
        return (record.topic, record.partition, record.offset)

    def dead_letter_destination(self) -> str | None:
        """``"Kafka topic <dlq_topic>"``; ``None`` without ``dlq_topic`` (a rejected
        event is then committed past, with a WARNING line only)."""
        return None if self._dlq_topic is None else f"Kafka topic {self._dlq_topic}"

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """The record as an :class:`ackgate.Message`, its fields read from the record
        (:class:`ackgate_kafka._message.RecordMessage` lists them: the body is the
        value, ``b""`` for a tombstone; ``id`` is ``"<topic>/<partition>/<offset>"``;
        ``lane`` the partition; ``attempt`` the delivery count the adapter keeps, as
        Kafka keeps none). With a value deserializer, a value that is not ``bytes`` is a
        ``TypeError``.
        """
        check_value(self, raw_event.value)
        return wrap(raw_event, broker_payload.tp, broker_payload.attempt)

    def to_messages(self, batch: EventBatch) -> list[Message]:
        """:meth:`to_message` for a whole partition batch, in one pass."""
        return wrap_all(self, batch.raw_events, batch.lane, batch.broker_payloads)

    async def open_stream(self) -> AsyncGenerator[tuple[Any, Any], None]:
        """Join the group and yield ``(ConsumerRecord, delivery)`` for every fetched record.

        Raises ``ConnectionError`` if the cluster cannot be reached at start and
        ``RuntimeError`` (chained to the aiokafka error) if polling fails later.
        Cancellation stops polling; the consumer stays open for the last advances.
        """
        chunks = self._chunks()
        try:
            async for _, part, epoch, _, deliveries in chunks:
                for delivery in deliveries:
                    # A hold or revoke while we were suspended at a yield makes the
                    # rest of this fetch stale: the seek / the owner after the
                    # rebalance fetches it again from the committed offset.
                    if part.epoch != epoch or part.draining:
                        break
                    record = delivery.record
                    part.yielded_next = record.offset + 1
                    yield record, delivery
        finally:
            await chunks.aclose()

    async def open_stream_batches(self) -> AsyncGenerator[EventBatch, None]:
        """:meth:`open_stream` by partition batch: :class:`ackgate.EventBatch` es of up
        to 256 records of one partition of a fetch (the records, their deliveries,
        the partition as lane and ``(topic, partition, offset)`` ids: an
        :class:`ackgate.IdRange` when the batch's offsets have no gap, one tuple per
        record otherwise). Between
        batches it stops, as :meth:`open_stream` does between records, once the
        partition was held or revoked meanwhile, so a rebalance waits for at most
        one stale batch per partition. Errors and cancellation as in
        :meth:`open_stream`."""
        chunks = self._chunks()
        new_batch = tuple.__new__
        try:
            async for tp, part, _, records, deliveries in chunks:
                part.yielded_next = records[-1].offset + 1
                # tuple.__new__ skips the NamedTuple's Python-level __new__: once per chunk.
                yield new_batch(EventBatch, (records, deliveries, tp, event_ids(tp, records)))
        finally:
            await chunks.aclose()

    async def aclose(self) -> None:
        """Stop the DLQ producer, then the consumer (which leaves the group).

        Cancellation: the consumer is still stopped (``finally``).
        """
        consumer, self._consumer = self._consumer, None
        dlq, self._dlq = self._dlq, None
        try:
            if dlq is not None:
                await dlq.stop()
        finally:
            if consumer is not None:
                await consumer.stop()
                log.info("Kafka consumer stopped group=%s", self._group_id)
