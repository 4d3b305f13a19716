"""Kafka adapter: one aiokafka consumer per group, committed only past what all subscribers did.

Install with ``pip install 'ackgate[kafka]'``. :class:`KafkaStreamProducer` joins a Kafka
consumer group (auto-commit always off), yields every record as
``(record, delivery)`` where ``record`` is the ``aiokafka.ConsumerRecord`` (raw bytes
in ``key``/``value``), and commits offsets as ackgate reports events resolved.

What each outcome does to the broker, per partition (the lane is ``(topic, partition)``):

* **acked** by every subscriber: committed past.
* **rejected** by at least one subscriber (none failed): copied to ``dlq_topic`` with the
  original key, value and headers plus ``ackgate.original.topic``,
  ``ackgate.original.partition``, ``ackgate.original.offset`` and one
  ``ackgate.reason`` header, and committed past only after the DLQ write is
  acknowledged. ``ackgate.reason`` is ``"rejected by <r> of <n> subscribers"``, followed,
  when rejecting subscribers gave reasons (SPEC §8), by ``": "`` and their
  ``"<subscriber_id>: <reason>"`` entries joined with ``"; "`` (in subscription order;
  not escaped: for people and logs, not for parsing). Without ``dlq_topic`` it
  is committed past and a WARNING names its offset: the event is dropped on purpose.
  The DLQ is at-least-once too: if the partition is revoked between the DLQ write and
  the commit, the new owner redelivers the event and it may be dead-lettered again.
* **failed** by any subscriber, or broadcast to **zero** subscribers: *held*. The
  partition is committed up to just before it and sought back to it, so this process
  fetches it (and everything after it) again. Nothing past a held offset is committed
  until a later delivery of it is acked or rejected.

One ``commit`` call per ``advance`` batch, for the last committable offset.

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

**Suspended at a yield (SPEC §10).** Backpressure (``overflow="block"``,
``max_outstanding``) or a paused rostered group can leave :meth:`open_stream`
suspended at a ``yield`` for any length of time, and aiokafka leaves the consumer
group once no ``getmany`` has run for ``max_poll_interval_ms``. So a keeper task
(one per producer, :mod:`ackgate_kafka._membership`) watches the time since the
stream's last ``getmany`` ended; past a third of ``max_poll_interval_ms`` it pauses
every assigned partition and calls ``getmany`` (200 ms timeout) on the stream's
behalf, which returns nothing but keeps the consumer in the group: heartbeats,
commits and rebalances go on as usual. Partitions assigned meanwhile are paused
too; records that arrive anyway are sought back to, so none is skipped. Before its
next fetch the stream wakes the keeper, waits for its ``getmany`` to return (never
two at once) and the paused partitions are resumed; records fetched before the
suspension are yielded as usual (or dropped as stale if a hold or revoke happened
meanwhile, as above). The stream only checks the keeper once per fetch: nothing is
added per record. A poll error while keeping ends the group at the stream's next
fetch, as a poll error would. During a rebalance while suspended, the revoke drain
still waits at most ``rebalance_drain_timeout`` for yielded events, which a paused
group may not resolve in time: they are then redelivered to the new owner.

**Identity and messages.** :meth:`~KafkaStreamProducer.get_event_id` is
``(topic, partition, offset)``, so a copy fetched again after a hold is not handed to
the subscribers that already acked it (SPEC §13): only those that failed it (or
joined since) see it twice. :meth:`~KafkaStreamProducer.to_message` builds the
``ackgate.Message`` a ``Service`` handler receives (tombstones, duplicate header
names and the delivery count are described there).

**Errors.** A broker error while starting or polling ends the group: subscribers get
``StreamTerminated`` whose ``__cause__`` is a ``ConnectionError`` (cannot reach the
cluster) or ``RuntimeError`` chained to the aiokafka error. A failed commit or DLQ
write is logged at ERROR with the partition and offset and raised, so the group ends
with ``AdvanceFailed`` and the broker redelivers everything not committed.

Logging is on ``ackgate.adapters.kafka`` and names topics, partitions and offsets,
never keys, values or headers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncGenerator, Hashable, Iterable, Sequence
from typing import Any

from ackgate import AdvanceItem, AdvanceOutcome, EventBatch, Message, SharedStreamProducer
from ackgate_kafka._dead_letter import SHARED_CONNECTION_OPTIONS, dead_letter_headers
from ackgate_kafka._membership import MembershipKeeper
from ackgate_kafka._message import check_value, wrap, wrap_all
from ackgate_kafka._offset_map import OffsetRuns, decode, encode
from ackgate_kafka._outage import OutageWatch
from ackgate_kafka._partitions import Delivery, PartitionState

log = logging.getLogger("ackgate.adapters.kafka")

_POLL_TIMEOUT_MS = 1000
# Records per EventBatch: big enough to amortize the group's per-batch step, small
# enough that a hold or revoke stops a fetch's stale rest between batches.
_BATCH_RECORDS = 256
_DEFAULT_MAX_POLL_INTERVAL_MS = 300_000  # aiokafka's default


def _import_aiokafka() -> Any:
    try:
        import aiokafka
        import aiokafka.abc
        import aiokafka.errors
    except ImportError as exc:
        raise ImportError("ackgate-kafka needs aiokafka: pip install 'ackgate[kafka]'") from exc
    # Virtual subclass: aiokafka checks the listener with isinstance, and importing the
    # ABC at module level would make aiokafka a hard dependency of this module.
    aiokafka.abc.ConsumerRebalanceListener.register(_RebalanceListener)
    return aiokafka


class _RebalanceListener:
    """aiokafka's rebalance callbacks, forwarded to the producer (awaited by aiokafka)."""

    def __init__(self, owner: KafkaStreamProducer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        await self._owner._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        assigned = list(assigned)
        for tp in assigned:
            self._owner._own(tp)
        keeper = self._owner._keeper
        if keeper is not None:
            keeper.assigned(assigned)


class KafkaStreamProducer(SharedStreamProducer):
    """Consume ``topics`` as consumer group ``group_id``; commit only what all subscribers resolved.

    ``consumer_options`` pass through to ``aiokafka.AIOKafkaConsumer`` (security
    protocol, SASL, ``ssl_context``, fetch sizes, ``max_poll_records``...); the
    connection-level ones are shared with the DLQ producer. ``enable_auto_commit=True``
    is refused with ``ValueError`` here, before any connection. With a ``dlq_topic``,
    key/value deserializers are refused too: the DLQ copy carries the original bytes.

    ``rebalance_drain_timeout`` (seconds, >= 0) bounds how long a revoke waits for the
    events already yielded from the revoked partitions to be advanced; keep it well
    below ``max_poll_interval_ms``, which bounds the whole rebalance.

    Outcomes, lanes, redelivery and logging are described in the module docstring.
    Nothing connects before :meth:`open_stream`; :meth:`aclose` stops the consumer
    (leaving the group) and the DLQ producer.
    """

    def __init__(
        self,
        topics: str | Sequence[str],
        *,
        bootstrap_servers: str | Sequence[str],
        group_id: str,
        dlq_topic: str | None = None,
        rebalance_drain_timeout: float = 10.0,
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
        if rebalance_drain_timeout < 0:
            raise ValueError("rebalance_drain_timeout must be >= 0")
        consumer_options.setdefault("auto_offset_reset", "earliest")
        self._bootstrap_servers = bootstrap_servers
        self._group_id = group_id
        self._dlq_topic = dlq_topic
        self._drain_timeout = rebalance_drain_timeout
        self._options = consumer_options
        self._consumer: Any = None
        self._dlq: Any = None
        self._errors: Any = None
        self._partitions: dict[Any, PartitionState] = {}
        self._epochs = itertools.count(1)
        # Held around every ownership check that is followed by a commit or seek, so a
        # revoke can never complete between the check and the broker call.
        self._lock = asyncio.Lock()
        # Set after every commit or hold; a draining revoke waits on it.
        self._progress = asyncio.Event()
        self._keeper: MembershipKeeper | None = None

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
            async for part, epoch, deliveries in chunks:
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
        the partition as lane and ``(topic, partition, offset)`` ids). Between
        batches it stops, as :meth:`open_stream` does between records, once the
        partition was held or revoked meanwhile, so a rebalance waits for at most
        one stale batch per partition. Errors and cancellation as in
        :meth:`open_stream`."""
        chunks = self._chunks()
        try:
            async for part, _, deliveries in chunks:
                tp = deliveries[0].tp
                topic, partition = tp.topic, tp.partition
                records = [delivery.record for delivery in deliveries]
                part.yielded_next = records[-1].offset + 1
                yield EventBatch(
                    records,
                    deliveries,
                    tp,
                    [(topic, partition, record.offset) for record in records],
                )
        finally:
            await chunks.aclose()

    async def _chunks(self) -> AsyncGenerator[tuple[PartitionState, int, list[Delivery]], None]:
        """``(partition, epoch, deliveries)`` for up to 256 records of one partition of a
        fetch at a time, counted as delivered (``Delivery.attempt``), finished offsets
        (the offset map) left out. Stops a partition's fetch, between chunks, once it was
        held or revoked meanwhile.

        Before a chunk that redelivers an offset, or the first chunk of an assignment, a
        commit at the committed offset records the new counts in its metadata, so a
        process that dies on the chunk's messages counts up on its next start.

        An offset that earlier lives delivered twice or more without finishing it (a
        crash loop, ``PartitionState.careful``) is yielded alone, and nothing after it
        until it is committed past (or held, or revoked): the next life then knows which
        offset the process died on, and the offsets around it do not count up with it.
        """
        batches = self._partition_batches()
        new_delivery = tuple.__new__
        try:
            async for tp, part, epoch, fetched in batches:
                at = 0
                while at < len(fetched):
                    if part.epoch != epoch or part.draining:
                        break
                    records = fetched[at : at + _BATCH_RECORDS]
                    if part.careful:
                        records = part.careful_piece(records)
                    at += len(records)
                    if part.finished:
                        records = [r for r in records if r.offset not in part.finished]
                        if not records:
                            continue
                    attempts, redelivered = part.count_deliveries(records)
                    if redelivered or part.announce:
                        await self._record_deliveries(tp, part, epoch, fetched[0].offset)
                        if part.epoch != epoch or part.draining:
                            break
                    yield (
                        part,
                        epoch,
                        [
                            new_delivery(Delivery, (tp, record, epoch, attempt))
                            for record, attempt in zip(records, attempts, strict=True)
                        ],
                    )
                    offset = records[0].offset
                    if offset in part.careful:
                        await self._committed_past(part, epoch, offset)
                        part.careful.discard(offset)
        finally:
            await batches.aclose()

    async def _partition_batches(
        self,
    ) -> AsyncGenerator[tuple[Any, PartitionState, int, Any], None]:
        """Join the group and yield ``(tp, partition, epoch, records)`` per partition of
        every fetch, skipping a partition whose epoch moved on (a hold or revoke
        while the caller was suspended) or that is draining."""
        aiokafka = _import_aiokafka()
        if self._consumer is not None:
            raise RuntimeError("KafkaStreamProducer.open_stream() may be called only once")
        self._errors = aiokafka.errors
        self._consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap_servers,
            group_id=self._group_id,
            enable_auto_commit=False,
            **self._options,
        )
        self._consumer.subscribe(self._topics, listener=_RebalanceListener(self))
        if self._dlq_topic is not None:
            shared = {k: v for k, v in self._options.items() if k in SHARED_CONNECTION_OPTIONS}
            self._dlq = aiokafka.AIOKafkaProducer(
                bootstrap_servers=self._bootstrap_servers, acks="all", **shared
            )
        try:
            await self._consumer.start()
            if self._dlq is not None:
                await self._dlq.start()
        except aiokafka.errors.KafkaError as exc:
            raise self._translate(exc, "could not join the consumer group") from exc
        log.info("Kafka consumer started group=%s topics=%s", self._group_id, self._topics)
        self.upstream_back()  # joined: the cluster answers (a no-op unless it was lost)
        keeper = self._keeper = MembershipKeeper(
            self._consumer,
            aiokafka.errors,
            self._options.get("max_poll_interval_ms", _DEFAULT_MAX_POLL_INTERVAL_MS),
            self._group_id,
        )
        keeper.start()
        watch = OutageWatch(self._consumer, self, self._bootstrap_servers)
        watch.start()
        try:
            while True:
                try:
                    # Once per fetch, never per record: the keeper may have polled
                    # while we were suspended at a yield; it stops before we poll.
                    if keeper.keeping or keeper.error is not None:
                        await keeper.wake()
                    keeper.fetch_started()
                    try:
                        fetched = await self._consumer.getmany(timeout_ms=_POLL_TIMEOUT_MS)
                    finally:
                        keeper.fetch_ended()
                except aiokafka.errors.KafkaError as exc:
                    log.error("Kafka poll failed group=%s: %r", self._group_id, exc)
                    raise self._translate(exc, "poll failed") from exc
                # Epochs as of the fetch, for every partition in it: a partition revoked
                # (and maybe assigned back) while we yielded an earlier one is stale too.
                batches = [(tp, self._own(tp), records) for tp, records in fetched.items()]
                epochs = [part.epoch for _, part, _ in batches]
                unloaded = [
                    (tp, part, epoch)
                    for (tp, part, _), epoch in zip(batches, epochs, strict=True)
                    if not part.map_loaded
                ]
                if unloaded:
                    await self._load_maps(unloaded)
                for (tp, part, records), epoch in zip(batches, epochs, strict=True):
                    if records and part.epoch == epoch and not part.draining:
                        yield tp, part, epoch, records
        finally:
            await watch.close()
            await keeper.close()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit past the batch's resolved prefix; dead-letter rejects; hold at a failure.

        Raises ``RuntimeError``/``ConnectionError`` (chained to aiokafka's error) when a
        commit or DLQ write fails, after logging the partition and offsets involved.
        Not cancelled by ackgate once started; if it is cancelled anyway, whatever was
        not committed is redelivered.
        """
        tp = batch[0].broker_payload.tp
        part = self._partitions[tp]
        epoch = part.epoch
        commit_to: int | None = None
        hold_at: int | None = None
        finished: list[int] = []
        stale = 0
        dlq_writes: list[Any] = []
        for item in batch:
            delivery: Delivery = item.broker_payload
            outcome = item.outcome
            offset = delivery.record.offset
            if delivery.epoch != epoch:
                stale += 1
            if outcome.failed or not (outcome.acked or outcome.rejected):
                if delivery.epoch == epoch and hold_at is None:
                    hold_at = offset
                continue
            # Clean. Past a hold, or fetched before one (stale), it goes into the offset
            # map as finished, once its DLQ copy (if any) is acknowledged: the map names
            # only offsets whose advance was clean, as a commit past them would be.
            if delivery.epoch < part.assigned_epoch:
                continue
            if outcome.rejected and self._dlq is not None:
                dlq_writes.append(await self._dead_letter(delivery, outcome))
            elif outcome.rejected:
                log.warning(
                    "Rejected event %s-%d@%d committed past without a DLQ (no dlq_topic)",
                    tp.topic,
                    tp.partition,
                    offset,
                )
            if delivery.epoch == epoch and hold_at is None:
                commit_to = offset + 1
            else:
                finished.append(offset)
        if stale:
            log.debug(
                "%d deliveries of %s-%d from an earlier epoch (refetched after a hold or "
                "revoked): not committed, recorded as finished if clean",
                stale,
                tp.topic,
                tp.partition,
            )
        if dlq_writes:
            try:
                await asyncio.gather(*dlq_writes)
            except self._errors.KafkaError as exc:
                log.error(
                    "DLQ write to %s failed for %s-%d before offset %s; not committing: %r",
                    self._dlq_topic,
                    tp.topic,
                    tp.partition,
                    commit_to,
                    exc,
                )
                raise self._translate(exc, "DLQ write failed") from exc
        async with self._lock:
            if not part.owned or part.epoch != epoch:
                if commit_to is not None or hold_at is not None:
                    log.info(
                        "Not committing %s-%d: partition revoked or refetched meanwhile; "
                        "its owner reads from the last committed offset",
                        tp.topic,
                        tp.partition,
                    )
                return
            for offset in finished:
                part.finish(offset)
            if hold_at is None and commit_to is not None:
                # Finished offsets right after the clean prefix were never yielded again
                # (or were, and their copies resolved before them): commit past them too.
                commit_to = part.finished.take_from(commit_to)
            target = hold_at if hold_at is not None else commit_to
            if part.refused:
                return
            if target is not None and (part.committed_next is None or target > part.committed_next):
                await self._commit(tp, part, target)
            elif finished and part.committed_next is not None:
                # The commit is held: a metadata-only commit keeps the map current, so
                # a restart does not replay what was finished meanwhile.
                await self._commit(tp, part, part.committed_next)
            if hold_at is not None and not part.refused:
                self._hold(tp, part, hold_at)
        self._progress.set()

    async def _load_maps(self, pending: list[tuple[Any, PartitionState, int]]) -> None:
        """Read the committed offset and its offset map of newly assigned partitions."""
        try:
            # aiokafka's public ``committed()`` drops the metadata; this is what it calls.
            committed = await self._consumer._coordinator.fetch_committed_offsets(
                [tp for tp, _, _ in pending]
            )
        except self._errors.KafkaError as exc:
            log.error("Kafka committed-offset fetch failed group=%s: %r", self._group_id, exc)
            raise self._translate(exc, "poll failed") from exc
        for tp, part, epoch in pending:
            if part.epoch != epoch or part.map_loaded:
                continue  # revoked meanwhile: the next assignment reads it again
            found = committed.get(tp)
            offset = found.offset if found is not None and found.offset >= 0 else None
            offset_map = None
            if offset is not None and found.metadata:
                decoded = decode(found.metadata, tp.topic, tp.partition, offset)
                if isinstance(decoded, str):
                    log.info(
                        "Ignoring the offset map committed with %s-%d@%d (%s): offsets past "
                        "it are delivered again",
                        tp.topic,
                        tp.partition,
                        offset,
                        decoded,
                    )
                else:
                    offset_map = decoded
            part.load(offset, offset_map)

    async def _committed_past(self, part: PartitionState, epoch: int, offset: int) -> None:
        """Wait until ``offset`` is committed past, held or revoked (advance and revoke
        set ``_progress``)."""
        while (
            part.epoch == epoch
            and not part.draining
            and (part.committed_next is None or part.committed_next <= offset)
        ):
            self._progress.clear()
            await self._progress.wait()

    async def _record_deliveries(
        self, tp: Any, part: PartitionState, epoch: int, first: int
    ) -> None:
        """Commit the committed offset again (``first``, where the fetch started, if
        there is none yet), its metadata now counting the deliveries about to be made."""
        async with self._lock:
            if not part.owned or part.epoch != epoch or part.draining:
                return
            await self._commit(
                tp, part, first if part.committed_next is None else part.committed_next
            )
            part.announce = False

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

    def _own(self, tp: Any) -> PartitionState:
        """Return ``tp``'s state, starting a new assignment if it was not owned.

        Called from the assignment callback and, in case a fetch races ahead of that
        callback, from the poll loop; idempotent while owned.
        """
        part = self._partitions.get(tp)
        if part is None:
            epoch = next(self._epochs)
            part = self._partitions[tp] = PartitionState(epoch=epoch, assigned_epoch=epoch)
        elif not part.owned:
            part.new_epoch(next(self._epochs))
            part.assigned_epoch = part.epoch
            part.owned = True
            part.committed_next = None
            part.held_at = None
            part.map_loaded = False
            part.announce = True
            part.finished = OffsetRuns()
            part.refused = False
        else:
            return part
        log.info("Partition assigned %s-%d group=%s", tp.topic, tp.partition, self._group_id)
        return part

    async def _on_revoked(self, revoked: Iterable[Any]) -> None:
        parts = {tp: self._partitions[tp] for tp in revoked if tp in self._partitions}
        if not parts:
            return
        for part in parts.values():
            part.draining = True
        try:
            async with asyncio.timeout(self._drain_timeout):
                while not all(part.drained() for part in parts.values()):
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            undrained = sorted(
                f"{tp.topic}-{tp.partition}@{part.committed_next}<{part.yielded_next}"
                for tp, part in parts.items()
                if not part.drained()
            )
            log.warning(
                "Rebalance drain timed out after %.1fs group=%s; uncommitted ranges are "
                "redelivered to the new owner: %s",
                self._drain_timeout,
                self._group_id,
                ", ".join(undrained),
            )
        async with self._lock:
            for part in parts.values():
                part.owned = False
                part.draining = False
                part.new_epoch(next(self._epochs))
        self._progress.set()
        log.info(
            "Partitions revoked group=%s: %s",
            self._group_id,
            ", ".join(sorted(f"{tp.topic}-{tp.partition}" for tp in parts)),
        )

    async def _dead_letter(self, delivery: Delivery, outcome: AdvanceOutcome) -> Any:
        """Queue the DLQ copy; return the future of its acknowledgement."""
        record = delivery.record
        headers = dead_letter_headers(record, outcome)
        try:
            return await self._dlq.send(
                self._dlq_topic, value=record.value, key=record.key, headers=headers
            )
        except self._errors.KafkaError as exc:
            log.error(
                "DLQ write to %s failed for %s-%d@%d: %r",
                self._dlq_topic,
                record.topic,
                record.partition,
                record.offset,
                exc,
            )
            raise self._translate(exc, "DLQ write failed") from exc

    async def _commit(self, tp: Any, part: PartitionState, offset: int) -> None:
        assert part.owned and (part.committed_next is None or offset >= part.committed_next)
        metadata = encode(
            tp.topic, tp.partition, offset, part.finished, part.seen_next, part.counts
        )
        try:
            await self._consumer.commit({tp: (offset, metadata)})
        except self._errors.CommitFailedError:
            # The group rebalanced under this assignment (an outage outlasted the
            # session): aiokafka rejoins, the revoke ends this assignment, and the
            # partition's owner (maybe this consumer again) reads from the last
            # committed offset. Nothing is skipped: deliveries of this epoch are stale.
            part.refused = True
            log.info(
                "Kafka commit refused group=%s %s-%d offset=%d: the group rebalanced "
                "meanwhile; the partition is read again from its last committed offset",
                self._group_id,
                tp.topic,
                tp.partition,
                offset,
            )
            return
        except self._errors.KafkaError as exc:
            log.error(
                "Kafka commit failed group=%s %s-%d offset=%d (last committed %s): %r",
                self._group_id,
                tp.topic,
                tp.partition,
                offset,
                part.committed_next,
                exc,
            )
            raise self._translate(exc, "commit failed") from exc
        part.committed(offset)

    def _hold(self, tp: Any, part: PartitionState, offset: int) -> None:
        part.new_epoch(next(self._epochs))
        # A draining partition is about to go to its new owner, who starts at the
        # committed offset (this one) anyway; seeking an outgoing partition is moot.
        if not part.draining:
            self._consumer.seek(tp, offset)
        log.log(
            logging.DEBUG if part.held_at == offset else logging.INFO,
            "Holding %s-%d at offset %d (failed or unsubscribed); redelivering from there",
            tp.topic,
            tp.partition,
            offset,
        )
        part.held_at = offset

    def _translate(self, exc: BaseException, what: str) -> Exception:
        message = f"Kafka {what} (group={self._group_id!r}, servers={self._bootstrap_servers!r})"
        if isinstance(exc, self._errors.KafkaConnectionError):
            return ConnectionError(f"{message}: cannot reach the cluster: {exc}")
        return RuntimeError(f"{message}: {exc!r}")
