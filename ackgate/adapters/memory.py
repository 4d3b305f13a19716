"""An in-process broker with Kafka-like semantics: the test double for services built on ackgate.

Nothing to install and nothing to start. :class:`MemoryBroker` holds topics split
into partitions, keyed records, consumer groups with committed offsets and a
dead-letter topic; :class:`MemoryStreamProducer` reads one topic for one consumer
group and is what you give ``manager.subscribe(..., producer=...)`` in tests::

    import asyncio
    from ackgate import SharedStreamManager
    from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

    async def test_my_service_commits_everything() -> None:
        broker = MemoryBroker()
        broker.create_topic("orders", partitions=3)
        for n in range(100):
            broker.publish("orders", {"order": n}, key=f"customer-{n % 7}")
        async with SharedStreamManager() as manager:
            service = asyncio.create_task(run_my_service(
                manager, producer=lambda: MemoryStreamProducer(broker, "orders", "svc")))
            async with asyncio.timeout(10):
                await broker.wait_drained("orders", "svc")   # everything committed
            service.cancel()
        assert broker.records("orders.dlq") == []            # nothing dead-lettered

What each outcome does to the broker (``advance`` walks every batch in order):

* **clean** (``acked >= 1``, nothing failed or rejected): the group's committed
  offset of the partition moves past the event.
* **rejected** (nobody failed, someone rejected): the record is copied to
  ``<topic>.dlq`` (same partition number, same key and value; ``reason`` and ``origin`` name why and
  where it came from), then committed past. ``reason`` is ``"rejected by R of N subscribers"``, then
  each reason given (docs/concepts.md#deferred-resolution, ``"<subscriber_id>: <reason>"``, in
  subscription order), separated by ``"; "``.
* **failed**, or **broadcast to nobody** (all counts zero): the partition is
  *held*. Nothing in it is committed past the event, and the producer seeks the
  partition back to it, so it is delivered again, followed by every later event
  of that partition, including ones already delivered (at-least-once, as with a
  Kafka consumer that seeks back). While a partition is held, outcomes of its
  later events are discarded: those events come again after the held one.

Lanes are partitions (``get_advance_lane`` returns the partition number). A new
producer on the same group starts from the committed offsets, so whatever was
not committed when a service stopped is delivered again. A redelivered event the
group already committed past is discarded when advanced.

Logging, on ``ackgate.adapters.memory``: INFO when a partition is held and sought
back, DEBUG for each dead-lettered record. Positions only, never record values.

The broker is not thread-safe: publish from the event loop's thread (or before
the loop runs). Records live in memory until the broker is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ackgate._contract.message import Message
from ackgate._contract.outcome import AdvanceItem, AdvanceOutcome
from ackgate._contract.producer import SharedStreamProducer

__all__ = [
    "MemoryBroker",
    "MemoryProducerStats",
    "MemoryStreamProducer",
    "Position",
    "Record",
]

logger = logging.getLogger("ackgate.adapters.memory")

DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where a record lives; the broker payload :class:`MemoryStreamProducer` yields.

    Ordered by topic, partition, offset."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """One stored record. ``reason`` and ``origin`` are set on dead-lettered copies only."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: Any
    reason: str | None = None
    origin: Position | None = None


@dataclass(frozen=True, slots=True)
class MemoryProducerStats:
    """What one :class:`MemoryStreamProducer` has done so far.

    ``delivered`` counts every yielded record, ``redelivered`` those among them the
    group had been given before (after a seek-back, or by an earlier producer).
    ``committed``, ``dead_lettered``, ``held`` and ``discarded`` split the advanced
    events by what happened to them; ``acked``, ``failed`` and ``rejected`` sum the
    subscriber resolutions of every advanced event.
    """

    delivered: int = 0
    redelivered: int = 0
    committed: int = 0
    dead_lettered: int = 0
    held: int = 0
    discarded: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0


def _key_bytes(key: bytes | str | int | None) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode("ascii")
    raise TypeError(f"record keys are bytes, str or int, not {type(key).__name__}")


class MemoryBroker:
    """Topics of partitioned, append-only logs and the committed offsets of consumer groups.

    A keyed record goes to partition ``zlib.crc32(key) % partitions`` (a ``str``
    key is hashed as UTF-8, an ``int`` as its decimal digits), the same in every
    process; unkeyed records are spread round-robin.
    """

    def __init__(self) -> None:
        self._logs: dict[str, list[list[Record]]] = {}
        self._round_robin: dict[str, int] = {}
        # Invariant: 0 <= committed[p] <= len(log[p]), and it only grows
        # (test_commit_only_moves_forward).
        self._committed: dict[tuple[str, str], list[int]] = {}
        # Per group and partition, one past the highest offset ever delivered to it:
        # what a producer counts as a redelivery, across restarts.
        self._delivered: dict[tuple[str, str], list[int]] = {}
        # Per group, deliveries of each (partition, offset) delivered more than once
        # (a record delivered once has no entry): ``Message.attempt``, across restarts.
        self._deliveries: dict[tuple[str, str], dict[tuple[int, int], int]] = {}
        self._publish_watchers: dict[str, set[asyncio.Event]] = {}
        self._commit_watchers: set[asyncio.Event] = set()

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions; creating it again with the same count
        is a no-op, with another count a ``ValueError``."""
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        existing = self._logs.get(name)
        if existing is not None:
            if len(existing) != partitions:
                raise ValueError(f"topic {name!r} exists with {len(existing)} partitions")
            return
        self._logs[name] = [[] for _ in range(partitions)]
        self._round_robin[name] = 0

    def partitions(self, topic: str) -> int:
        """Number of partitions of ``topic``."""
        return len(self._log(topic))

    def partition_for(self, topic: str, key: bytes | str | int) -> int:
        """The partition a record with ``key`` is published to."""
        raw = _key_bytes(key)
        assert raw is not None
        return zlib.crc32(raw) % self.partitions(topic)

    def publish(self, topic: str, value: Any, key: bytes | str | int | None = None) -> Position:
        """Append ``value`` to ``topic`` and wake its producers; return where it was stored."""
        log = self._log(topic)
        raw = _key_bytes(key)
        if raw is None:
            partition = self._round_robin[topic] % len(log)
            self._round_robin[topic] += 1
        else:
            partition = zlib.crc32(raw) % len(log)
        return self._append(Record(topic, partition, len(log[partition]), raw, value))

    def records(self, topic: str, partition: int | None = None) -> list[Record]:
        """The records of one partition, or of every partition in partition order.

        A dead-letter topic that was never written to reads as empty.
        """
        if topic not in self._logs and topic.endswith(DLQ_SUFFIX):
            return []
        log = self._log(topic)
        if partition is not None:
            return list(log[partition])
        return [record for part in log for record in part]

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset the next published record will get."""
        return {p: len(part) for p, part in enumerate(self._log(topic))}

    def committed(self, topic: str, group: str) -> dict[int, int]:
        """Per partition, the first offset ``group`` has not committed past (0 if none)."""
        return dict(enumerate(self._group_offsets(topic, group)))

    async def wait_drained(self, topic: str, group: str) -> None:
        """Return once ``group`` has committed past every record of ``topic``.

        Records published while waiting count too. Cancellation leaves nothing behind.
        """
        changed = asyncio.Event()
        self._commit_watchers.add(changed)
        self._publish_watchers.setdefault(topic, set()).add(changed)
        try:
            while self.committed(topic, group) != self.end_offsets(topic):
                changed.clear()
                await changed.wait()
        finally:
            self._commit_watchers.discard(changed)
            self._publish_watchers[topic].discard(changed)

    def _log(self, topic: str) -> list[list[Record]]:
        try:
            return self._logs[topic]
        except KeyError:
            raise ValueError(f"unknown topic {topic!r}; create it first") from None

    def _group_offsets(self, topic: str, group: str) -> list[int]:
        partitions = len(self._log(topic))
        return self._committed.setdefault((topic, group), [0] * partitions)

    def _delivery_marks(self, topic: str, group: str) -> list[int]:
        return self._delivered.setdefault((topic, group), [0] * len(self._log(topic)))

    def _append(self, record: Record) -> Position:
        self._logs[record.topic][record.partition].append(record)
        for event in self._publish_watchers.get(record.topic, ()):
            event.set()
        return Position(record.topic, record.partition, record.offset)

    def _commit(self, topic: str, group: str, partition: int, offset: int) -> None:
        offsets = self._group_offsets(topic, group)
        assert offsets[partition] <= offset <= len(self._logs[topic][partition])
        offsets[partition] = offset
        for event in self._commit_watchers:
            event.set()

    def _dead_letter(self, record: Record, reason: str) -> Position:
        dlq = record.topic + DLQ_SUFFIX
        if dlq not in self._logs:
            self.create_topic(dlq, len(self._logs[record.topic]))
        partition = record.partition % len(self._logs[dlq])
        origin = Position(record.topic, record.partition, record.offset)
        offset = len(self._logs[dlq][partition])
        return self._append(
            Record(dlq, partition, offset, record.key, record.value, reason, origin)
        )

    def _watch(self, topic: str, event: asyncio.Event) -> None:
        self._publish_watchers.setdefault(topic, set()).add(event)

    def _unwatch(self, topic: str, event: asyncio.Event) -> None:
        self._publish_watchers.get(topic, set()).discard(event)


class MemoryStreamProducer(SharedStreamProducer):
    """Reads ``topic`` as consumer group ``group`` of ``broker``; yields ``(value, Position)``.

    Starts from the group's committed offsets, takes one record from each partition
    in turn, and waits for new records without polling. See the module docstring
    for what each outcome does; lanes are partition numbers. One producer per
    group and topic at a time, as one ackgate group reads it.
    """

    messaging_system = "ackgate_memory"

    def __init__(self, broker: MemoryBroker, topic: str, group: str) -> None:
        self._broker = broker
        self._topic = topic
        self._group = group
        # Invariant: _fetch[p] > committed[p] once the record at committed[p] was
        # yielded; a hold sets it back to committed[p] (test_hold_seeks_back).
        self._fetch: list[int] = []
        self._wake: asyncio.Event | None = None
        self._counts = dict.fromkeys(MemoryProducerStats.__dataclass_fields__, 0)
        self._attempts = broker._deliveries.setdefault((topic, group), {})

    @property
    def stats(self) -> MemoryProducerStats:
        """Counters so far (a frozen snapshot)."""
        return MemoryProducerStats(**self._counts)

    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Yield ``(value, Position)`` forever, one partition after another.

        Cancellation arrives while waiting for records or at a yield; nothing
        needs cleaning up but the wake-up registration.
        """
        if self._wake is not None:
            raise RuntimeError("open_stream() may be called once per producer")
        self._wake = asyncio.Event()
        self._fetch = list(self._broker.committed(self._topic, self._group).values())
        return self._stream(self._wake)

    async def _stream(self, wake: asyncio.Event) -> AsyncIterator[tuple[Any, Any]]:
        self._broker._watch(self._topic, wake)
        log = self._broker._log(self._topic)
        high = self._broker._delivery_marks(self._topic, self._group)
        turn = 0
        try:
            while True:
                record = self._next_record(log, high, turn)
                if record is None:
                    wake.clear()
                    await wake.wait()
                    continue
                turn = record.partition + 1
                yield record.value, Position(record.topic, record.partition, record.offset)
        finally:
            self._broker._unwatch(self._topic, wake)

    def _next_record(self, log: list[list[Record]], high: list[int], turn: int) -> Record | None:
        for i in range(len(log)):
            p = (turn + i) % len(log)
            offset = self._fetch[p]
            if offset < len(log[p]):
                self._fetch[p] = offset + 1
                self._counts["delivered"] += 1
                if offset < high[p]:
                    self._counts["redelivered"] += 1
                    self._attempts[p, offset] = self._attempts.get((p, offset), 1) + 1
                else:
                    high[p] = offset + 1
                return log[p][offset]
        return None

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The record's partition number."""
        position: Position = broker_payload
        return position.partition

    def get_event_id(self, broker_payload: Any) -> Hashable:
        """``(partition, offset)``: a record's identity within the topic
        (docs/concepts.md#redelivery-memory).

        A held partition is sought back and delivers its later records again; a
        subscriber that acked one of them already is not handed the copy.
        """
        position: Position = broker_payload
        return (position.partition, position.offset)

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """The record as a :class:`~ackgate.Message`: its value as ``body``, its key,
        id ``"<topic>/<partition>/<offset>"``, lane = partition, ``raw`` = the
        :class:`Record`, no headers. ``attempt`` counts the deliveries of the record
        to the consumer group, as the broker does for every producer of the group
        (1 the first time; a seek-back delivers the held record and every later one
        of its partition again, and a new producer redelivers what was not
        committed).
        A :class:`~ackgate.Service` needs ``bytes`` values: any other value is a
        ``TypeError``.
        """
        position: Position = broker_payload
        if not isinstance(raw_event, bytes):
            raise TypeError(
                f"record {position.topic}/{position.partition}/{position.offset} holds a "
                f"{type(raw_event).__name__}; a Service reads bytes: publish bytes values "
                "(json.dumps(value).encode(), for instance)"
            )
        record = self._broker._log(position.topic)[position.partition][position.offset]
        return Message(
            body=raw_event,
            id=f"{position.topic}/{position.partition}/{position.offset}",
            key=record.key,
            lane=position.partition,
            attempt=self._attempts.get((position.partition, position.offset), 1),
            raw=record,
        )

    def destination_name(self) -> str:
        """What it reads, for spans' ``messaging.destination.name``."""
        return self._topic

    def dead_letter_destination(self) -> str:
        """``"memory topic <topic>.dlq"``: every rejected record is copied there."""
        return f"memory topic {self._topic}{DLQ_SUFFIX}"

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit, dead-letter or hold each event of ``batch`` in order (see the module docstring).

        Runs without awaiting, so cancellation cannot split a batch.
        """
        for payload, outcome in batch:
            self._advance_one(payload, outcome)

    def _advance_one(self, position: Position, outcome: AdvanceOutcome) -> None:
        counts = self._counts
        counts["acked"] += outcome.acked
        counts["failed"] += outcome.failed
        counts["rejected"] += outcome.rejected
        partition = position.partition
        committed = self._broker._group_offsets(self._topic, self._group)[partition]
        if position.offset != committed:
            # Behind: a duplicate of an event already committed past. Ahead: an event
            # delivered before its partition was held; the seek-back delivers it again.
            counts["discarded"] += 1
            return
        if outcome.failed or not (outcome.acked or outcome.rejected):
            counts["held"] += 1
            self._fetch[partition] = committed
            if self._wake is not None:
                self._wake.set()
            logger.info(
                "holding %s[%d] at offset %d (failed=%d, subscribers=%d); seeking back",
                self._topic,
                partition,
                committed,
                outcome.failed,
                outcome.acked + outcome.failed + outcome.rejected,
            )
            return
        if outcome.rejected:
            record = self._broker._log(self._topic)[partition][committed]
            total = outcome.acked + outcome.rejected
            reason = "; ".join(
                (f"rejected by {outcome.rejected} of {total} subscribers", *outcome.reasons)
            )
            dlq = self._broker._dead_letter(record, reason)
            counts["dead_lettered"] += 1
            logger.debug(
                "dead-lettered %s[%d]@%d to %s[%d]@%d",
                self._topic,
                partition,
                committed,
                dlq.topic,
                dlq.partition,
                dlq.offset,
            )
        else:
            counts["committed"] += 1
        self._broker._commit(self._topic, self._group, partition, committed + 1)

    async def aclose(self) -> None:
        """Drop the wake-up registration. Nothing to cancel; never raises."""
        if self._wake is not None:
            self._broker._unwatch(self._topic, self._wake)
