"""The read side of the Kafka producer: joining the group, fetching, cutting fetches into chunks.

:class:`Fetcher` runs the poll loop (with the membership keeper and the outage watch),
reads the offset map of newly assigned partitions, and cuts every partition's fetch
into chunks of deliveries: counted (``Delivery.attempt``), finished offsets left out,
careful offsets alone. :class:`~ackgate_kafka.KafkaStreamProducer` turns the chunks into
``open_stream`` pairs or ``EventBatch`` es. The rules are described in
:mod:`ackgate_kafka._producer`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncGenerator, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

from ackgate import BrokerLag, IdRange
from ackgate_kafka._commits import PartitionOwner
from ackgate_kafka._dead_letter import SHARED_CONNECTION_OPTIONS
from ackgate_kafka._lag import LagWatch
from ackgate_kafka._membership import MembershipKeeper
from ackgate_kafka._offset_map import decode
from ackgate_kafka._outage import OutageWatch
from ackgate_kafka._partitions import Delivery, PartitionState
from ackgate_kafka._refusals import diagnose

log = logging.getLogger("ackgate.adapters.kafka")

_POLL_TIMEOUT_MS = 1000
# Records per EventBatch: big enough to amortize the group's per-batch step, small
# enough that a hold or revoke stops a fetch's stale rest between batches.
_BATCH_RECORDS = 256
_DEFAULT_MAX_POLL_INTERVAL_MS = 300_000  # aiokafka's default
# How often the maps of partitions that did not commit for this long are committed again
# where what the members acked past the commit changed (``PartitionOwner._refresh_maps``):
# a SIGKILL then replays to a member about twice this long of its work, at most.
_MAP_REFRESH_SECONDS = 0.025


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

    def __init__(self, owner: Fetcher) -> None:
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


class Chunk(NamedTuple):
    """Up to 256 records of one partition of one fetch and their deliveries (equal
    lengths, at least one record, offsets increasing), fetched in ``epoch``."""

    tp: Any
    part: PartitionState
    epoch: int
    records: Sequence[Any]
    deliveries: list[Delivery]


def event_ids(tp: Any, records: Sequence[Any]) -> Sequence[Hashable]:
    """The ``(topic, partition, offset)`` ids of a chunk's records: one
    :class:`~ackgate.IdRange` when their offsets have no gap, so the group remembers
    them as one interval; else one tuple per record (a compacted topic, transaction
    markers, finished offsets left out of the chunk)."""
    first = records[0].offset
    length = len(records)
    if records[-1].offset - first + 1 == length:
        return IdRange((tp.topic, tp.partition), first, length)
    topic, partition = tp.topic, tp.partition
    return [(topic, partition, record.offset) for record in records]


class Fetcher(PartitionOwner):
    """The poll loop and the chunks of each fetch (the read side of
    :class:`~ackgate_kafka.KafkaStreamProducer`)."""

    _topics: list[str]
    _options: dict[str, Any]
    _dlq_options: dict[str, Any]
    _lag_watch: LagWatch | None = None

    def broker_lag(self) -> BrokerLag | None:
        """Per partition of the topics, assigned here or not: its end offset minus the
        group's committed offset, measured every few seconds
        (:mod:`ackgate_kafka._lag`); ``None`` until the first measurement."""
        watch = self._lag_watch
        return None if watch is None else watch.last

    async def _chunks(self) -> AsyncGenerator[Chunk, None]:
        """A :class:`Chunk` for up to 256 records of one partition of a fetch at a
        time, counted as delivered (``Delivery.attempt``), finished offsets
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
                    attempts = part.count_deliveries(records)
                    if attempts is not None or part.announce:
                        await self._record_deliveries(tp, part, epoch, fetched[0].offset)
                        if part.epoch != epoch or part.draining:
                            break
                    if attempts is None:
                        deliveries = [
                            new_delivery(Delivery, (tp, record, epoch, 1)) for record in records
                        ]
                    else:
                        deliveries = [
                            new_delivery(Delivery, (tp, record, epoch, attempt))
                            for record, attempt in zip(records, attempts, strict=True)
                        ]
                    yield Chunk(tp, part, epoch, records, deliveries)
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
            options = {"acks": "all", **shared, **self._dlq_options}
            self._dlq = aiokafka.AIOKafkaProducer(
                bootstrap_servers=self._bootstrap_servers, **options
            )
        try:
            await self._consumer.start()
            if self._dlq is not None:
                await self._dlq.start()
        except aiokafka.errors.KafkaError as exc:
            # "Unable to bootstrap" hides a refusal: connect once more to find out.
            if isinstance(exc, aiokafka.errors.KafkaConnectionError):
                refused = await diagnose(aiokafka, self._consumer._client, self._address)
                if refused is not None:
                    raise refused from exc
            unknown = await _unknown_hosts(self._bootstrap_servers)
            what = "could not join the consumer group"
            if unknown:
                what += f" (unknown host: {', '.join(unknown)})"
            raise self._translate(exc, what) from exc
        log.info("Kafka consumer started group=%s topics=%s", self._group_id, self._topics)
        self.upstream_back()  # joined: the cluster answers (a no-op unless it was lost)
        keeper = self._keeper = MembershipKeeper(
            self._consumer,
            aiokafka.errors,
            self._options.get("max_poll_interval_ms", _DEFAULT_MAX_POLL_INTERVAL_MS),
            self._group_id,
        )
        keeper.start()
        watch = OutageWatch(self._consumer, self, self._bootstrap_servers, self._options)
        watch.start()
        refresh = asyncio.get_running_loop().create_task(self._refresh_maps(_MAP_REFRESH_SECONDS))
        lag = self._lag_watch = LagWatch(self._consumer, self._topics, self._group_id)
        lag.start()
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
            refresh.cancel()
            await asyncio.gather(refresh, return_exceptions=True)
            await lag.close()
            await watch.close()
            await keeper.close()

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
                decoded = decode(
                    found.metadata, tp.topic, tp.partition, offset, self._map_max_bytes
                )
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
                    skipped = sum(end - start for start, end in decoded.finished.runs())
                    log.info(
                        "Using the offset map committed with %s-%d@%d: %d offset(s) past it "
                        "finished (skipped when fetched again), %d with delivery counts",
                        tp.topic,
                        tp.partition,
                        offset,
                        skipped,
                        len(decoded.counts),
                    )
            part.load(offset, offset_map)
            progress = self._subscriber_progress
            if offset_map is not None and offset_map.members and progress is not None:
                # Before anything of the partition is yielded: each member is not handed
                # what it acked in an earlier life.
                progress.seed_acked((tp.topic, tp.partition), offset_map.members)

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


async def _unknown_hosts(servers: str | Sequence[str]) -> list[str]:
    """The bootstrap servers whose host name does not resolve: aiokafka's own error
    says only that it could not bootstrap, and names the DNS failure in its log."""
    listed = servers.split(",") if isinstance(servers, str) else list(servers)
    loop = asyncio.get_running_loop()
    unknown = []
    for server in (s.strip() for s in listed if s.strip()):
        host = server.rpartition(":")[0] or server
        try:
            async with asyncio.timeout(2.0):
                await loop.getaddrinfo(host.strip("[]"), None)
        except socket.gaierror:
            unknown.append(repr(host))
        except (OSError, TimeoutError):
            continue
    return unknown
