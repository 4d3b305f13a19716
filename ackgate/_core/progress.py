"""A group's :class:`~ackgate.SubscriberProgress`: its redelivery memory, read and
seeded per roster member (docs/concepts.md#redelivery-memory).

Reading it walks only the memory's spans and copies of one prefix at or past the
asked offset (what is outstanding, not what was advanced), when a producer asks:
nothing is added to the path of an event.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from ackgate._core.redelivery import RedeliveryMemory, _Spanned
from ackgate._core.subscription import Subscription


def _bits_of(mask: int) -> list[int]:
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return bits


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` sorted, overlapping and adjacent ones merged."""
    runs.sort()
    merged: list[tuple[int, int]] = []
    for start, stop in runs:
        if merged and start <= merged[-1][1]:
            if stop > merged[-1][1]:
                merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


#: The longest span a seed adds (a Kafka fetch's chunk is 256 records).
_SEED_PIECE = 256


def _acked_in_open_parts(
    sub: Subscription, prefix: tuple[Hashable, ...], first: int
) -> list[tuple[int, int]]:
    """The offsets ``>= first`` of ``prefix`` that ``sub`` acked in runs it is still
    busy with: a span remembers a subscriber's acks only once its whole part in the
    run is done, so the run's state is read, by the rule of
    ``Subscription._acked_in_open_part`` (handed, window closed, not rejected or
    failed, nothing owing)."""
    runs: list[tuple[int, int]] = []
    for run, part in sub._parts.items():
        memory = run.memory
        if not isinstance(memory, _Spanned):
            continue  # a run of cells remembers each ack as it is made
        span = memory.span
        if span.prefix != prefix or span.stop <= first:
            continue
        handed = min(sub._cursor - run.position, run.count)
        marked = part[1]
        current = sub._current_index if run is sub._current else -1
        outputs = sub._outputs
        batches = sub._batches
        start = None
        for index in range(max(0, first - span.first), max(handed, 0) + 1):
            acked = (
                index < handed
                and not marked >> index & 1
                and index != current
                and not (outputs and (run, index) in outputs)
                and not (batches and any(batch.owes_event(run, index) for batch in batches))
            )
            if acked and start is None:
                start = index
            elif not acked and start is not None:
                runs.append((span.first + start, span.first + index))
                start = None
    return runs


class GroupProgress:
    """What the roster members of one group acked, from its redelivery memory."""

    __slots__ = ("_members", "_memory", "_roster", "overflows")

    def __init__(
        self,
        memory: RedeliveryMemory,
        roster: tuple[Hashable, ...] | None,
        members: Mapping[Hashable, Subscription],
    ) -> None:
        self._memory = memory
        self._roster = roster
        #: The group's live subscriptions by id (``Group.members``, the same dict).
        self._members = members
        #: Records of progress that did not fit (``GroupStats.progress_overflows``).
        self.overflows = 0

    @property
    def roster(self) -> tuple[Hashable, ...] | None:
        return self._roster

    def acked_offsets(
        self, prefix: tuple[Hashable, ...], first: int
    ) -> dict[Hashable, list[tuple[int, int]]]:
        if self._roster is None:
            return {}
        memory = self._memory
        by_bit: dict[int, list[tuple[int, int]]] = {}
        for span in memory.spans_reaching(prefix, first):
            low = max(first, span.first)
            for bit in _bits_of(span.mask):
                by_bit.setdefault(bit, []).append((low, span.stop))
            if span.partial:
                for flag, acked in span.partial.items():
                    if span.mask & flag:
                        continue  # acked all of it in another copy of the span
                    runs = by_bit.setdefault(flag.bit_length() - 1, [])
                    for index in _bits_of(acked):
                        offset = span.first + index
                        if offset >= first:
                            runs.append((offset, offset + 1))
        for offset, mask in memory.ranged_cells(prefix, first):
            for bit in _bits_of(mask):
                by_bit.setdefault(bit, []).append((offset, offset + 1))
        members = set(self._roster)
        result: dict[Hashable, list[tuple[int, int]]] = {}
        for bit, runs in by_bit.items():
            subscriber_id = memory.subscriber_of(bit)
            if subscriber_id in members:
                result[subscriber_id] = runs
        for subscriber_id, sub in self._members.items():
            if subscriber_id in members and sub._parts:
                open_acks = _acked_in_open_parts(sub, prefix, first)
                if open_acks:
                    result.setdefault(subscriber_id, []).extend(open_acks)
        return {subscriber_id: _merged(runs) for subscriber_id, runs in result.items()}

    def seed_acked(
        self, prefix: tuple[Hashable, ...], acked: Mapping[Hashable, Sequence[tuple[int, int]]]
    ) -> None:
        if self._roster is None:
            return
        memory = self._memory
        members = set(self._roster)
        # A sweep over the runs' edges: each stretch between two edges is one span,
        # with the flags of the members whose runs cover it.
        edges: dict[int, int] = {}
        for subscriber_id, runs in acked.items():
            bit = memory.bit(subscriber_id) if subscriber_id in members else None
            if bit is None:
                continue
            for start, stop in _merged(list(runs)):
                edges[start] = edges.get(start, 0) ^ (1 << bit)
                edges[stop] = edges.get(stop, 0) ^ (1 << bit)
        mask = 0
        previous = 0
        for offset in sorted(edges):
            if mask:
                # Pieces of at most _SEED_PIECE ids: a long span would make every
                # lookup of the prefix scan further back (``RedeliveryMemory._longest``).
                for low in range(previous, offset, _SEED_PIECE):
                    memory.seed(prefix, low, min(offset, low + _SEED_PIECE), mask)
            mask ^= edges[offset]
            previous = offset

    def progress_overflowed(self) -> None:
        self.overflows += 1
