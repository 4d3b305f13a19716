"""What the Kafka adapter keeps per record and per partition.

:class:`Delivery` is the broker payload of one record; :class:`PartitionState` is this
consumer's view of one assigned partition: its epoch, which makes deliveries fetched
before a hold or a revoke stale, the offsets yielded and committed in it, and the
offset map (finished offsets past the commit, delivery counts) its commits carry. The
rules that use them are described in :mod:`ackgate_kafka._producer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ackgate_kafka._offset_map import OffsetMap, OffsetRuns


class Delivery(NamedTuple):
    """The broker payload: the record, its partition, the epoch it was fetched in and
    its delivery count (``Message.attempt``).

    A NamedTuple because one is built per record on the hot path.
    """

    tp: Any
    record: Any
    epoch: int
    attempt: int


@dataclass(slots=True)
class PartitionState:
    """This consumer's view of one partition.

    Invariants: only deliveries whose ``epoch`` equals ``self.epoch`` are ever
    committed, and only while ``owned`` (checked under the producer's lock);
    ``committed_next`` only grows within one assignment (asserted in ``_commit``). The
    epoch changes on every assignment, revocation and hold. Tests:
    ``test_acked_commits_once_per_batch_and_failed_is_held_then_redelivered``,
    ``test_rebalance_drains_resolved_prefix_and_never_commits_revoked``,
    ``test_consumer_joins_and_leaves_mid_stream``.
    """

    epoch: int
    # The epoch this assignment started with: deliveries of earlier ones are never
    # recorded as finished (their owner's commit decides).
    assigned_epoch: int = 0
    owned: bool = True
    draining: bool = False
    # Offset after the last record yielded in this epoch; None if none yet.
    yielded_next: int | None = None
    # Offset after the last commit this consumer made in this assignment.
    committed_next: int | None = None
    # Offset of the last hold; repeated holds at the same offset log at DEBUG only, so a
    # group whose subscribers are all force-failed does not flood the log.
    held_at: int | None = None
    # The offset map of the commit this assignment started from is read (and merged
    # into ``finished``/``counts``/``seen_next``) before anything of it is yielded.
    map_loaded: bool = False
    # The first deliveries of an assignment are recorded in a commit's metadata before
    # they are yielded, so a process that dies on its first message still counts up.
    announce: bool = True
    # Offsets past ``committed_next`` advanced clean; never yielded again, and commits
    # move past them. Invariant: every entry > ``committed_next`` (pruned in
    # ``committed``); only clean outcomes of this assignment are added (``advance``).
    finished: OffsetRuns = field(default_factory=OffsetRuns)
    # Delivery counts, kept for the producer's life: an offset below ``seen_next`` was
    # delivered at least once; ``counts`` holds the ones delivered more than once.
    seen_next: int = 0
    counts: dict[int, int] = field(default_factory=dict)
    # Offsets the map said were delivered twice or more and not finished: earlier lives
    # died with them in flight (maybe on them). Yielded one at a time, each once the
    # one before is committed (``_chunks``), so a crash loop counts up only the offset
    # it dies on. Invariant: a subset of ``counts``, all >= ``committed_next``.
    careful: set[int] = field(default_factory=set)
    # Set when the coordinator refused a commit because the group rebalanced under this
    # assignment (after an outage longer than the session): nothing more can be
    # committed in it, so a revoke has nothing to wait for.
    refused: bool = False
    # The metadata of this assignment's last commit (a refresh commits only a change).
    metadata: str | None = None
    # When this consumer last committed it (``time.monotonic()``).
    committed_at: float = 0.0
    # This assignment's map did not fit once (logged then, counted every time).
    overflowed: bool = False

    def count_deliveries(self, records: Sequence[Any]) -> list[int] | None:
        """Count one more delivery of each record (in offset order); return their attempt
        numbers, or ``None`` when this is the first delivery of every one of them (the
        common case, answered without looking at each record)."""
        seen, counts = self.seen_next, self.counts
        last = records[-1].offset + 1
        if records[0].offset >= seen and not counts:
            self.seen_next = last
            return None
        attempts = []
        for record in records:
            offset = record.offset
            n = counts.get(offset, 1 if offset < seen else 0) + 1
            if n > 1:
                counts[offset] = n
            attempts.append(n)
        self.seen_next = max(seen, last)
        return attempts if max(attempts) > 1 else None

    def load(self, committed: int | None, offset_map: OffsetMap | None) -> None:
        """Start this assignment from the broker's commit and its (trusted) map."""
        self.committed_next = committed
        self.map_loaded = True
        self.careful = set()
        if committed is None:
            return
        self.counts = {o: n for o, n in self.counts.items() if o >= committed}
        if offset_map is not None:
            self.finished = offset_map.finished
            self.seen_next = max(self.seen_next, offset_map.delivered_next)
            for offset, n in offset_map.counts.items():
                if n > self.counts.get(offset, 0):
                    self.counts[offset] = n
                if n >= 2 and offset not in self.finished:
                    self.careful.add(offset)

    def careful_piece(self, records: Sequence[Any]) -> Sequence[Any]:
        """The first record alone if it is careful, else the records before the first
        careful one."""
        careful = self.careful
        for i, record in enumerate(records):
            if record.offset in careful:
                return records[: i or 1]
        return records

    def finish(self, start: int, end: int) -> None:
        """Record the offsets ``[start, end)`` as finished, those past the commit only."""
        if self.committed_next is not None:
            start = max(start, self.committed_next + 1)
        if start < end:
            self.finished.add_run(start, end)

    def committed(self, offset: int) -> None:
        self.committed_next = offset
        self.finished.drop_below(offset + 1)
        if self.counts:
            self.counts = {o: n for o, n in self.counts.items() if o >= offset}
        if self.careful:
            self.careful = {o for o in self.careful if o >= offset}

    def drained(self) -> bool:
        """True when everything yielded in this epoch is committed (or can never be)."""
        return (
            not self.owned
            or self.refused
            or self.yielded_next is None
            or (self.committed_next is not None and self.committed_next >= self.yielded_next)
        )

    def new_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.yielded_next = None
