"""What a producer is told about each event it must advance."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, overload


@dataclass(frozen=True, slots=True)
class AdvanceOutcome:
    """How the subscribers in an event's snapshot resolved it.

    Every subscriber in the snapshot is counted in exactly one field, so
    ``acked + failed + rejected`` is the snapshot size. ``reasons`` holds one
    ``"<subscriber_id>: <reason>"`` per rejecting subscriber that gave a reason,
    in subscription order (the order in which the group's subscriptions were
    created by ``subscribe``; one that leaves and subscribes again counts from its
    new ``subscribe``). Write them into the dead-letter record.
    """

    acked: int
    failed: int
    rejected: int
    reasons: tuple[str, ...] = ()

    @property
    def is_clean(self) -> bool:
        """True only if at least one subscriber acked and nobody failed or rejected.

        An event broadcast to nobody is not clean: no one accepted it, so there is
        no ground to commit it.
        """
        return self.failed == 0 and self.rejected == 0 and self.acked >= 1


class AdvanceItem(NamedTuple):
    """One event of an :meth:`SharedStreamProducer.advance` batch."""

    broker_payload: Any
    outcome: AdvanceOutcome


class EventBatch(NamedTuple):
    """Events fetched together, as :meth:`SharedStreamProducer.open_stream_batches`
    yields them: the bulk form of ``open_stream``'s pairs.

    ``raw_events[i]`` and ``broker_payloads[i]`` are one event (equal lengths, at
    least one event). Every event of a batch is in the same ``lane`` (what
    :meth:`~SharedStreamProducer.get_advance_lane` would return for each of
    them), and ``event_ids`` is ``None`` or holds what
    :meth:`~SharedStreamProducer.get_event_id` would return for each.
    """

    raw_events: Sequence[Any]
    broker_payloads: Sequence[Any]
    lane: Hashable = None
    event_ids: Sequence[Hashable] | None = None


_NO_EXCEPTIONS: Mapping[int, AdvanceOutcome] = MappingProxyType({})


class AdvanceRun(NamedTuple):
    """Consecutive events of one lane, in stream order, resolved and advanced together:
    what :meth:`SharedStreamProducer.advance_runs` receives.

    ``outcome`` is the outcome of every event of the run except those listed in
    ``exceptions`` (index into ``broker_payloads`` -> that event's outcome). A run
    whose events were all treated alike has no exceptions, so a cumulative broker
    (Kafka) commits it in O(1): the last payload is all it needs.
    """

    broker_payloads: Sequence[Any]
    outcome: AdvanceOutcome
    exceptions: Mapping[int, AdvanceOutcome] = _NO_EXCEPTIONS

    def outcome_of(self, index: int) -> AdvanceOutcome:
        """The outcome of the event at ``index``."""
        return self.exceptions.get(index, self.outcome)

    def items(self) -> list[AdvanceItem]:
        """The run as :meth:`~SharedStreamProducer.advance` items, one per event."""
        outcome, exceptions = self.outcome, self.exceptions
        if not exceptions:
            return [AdvanceItem(payload, outcome) for payload in self.broker_payloads]
        return [
            AdvanceItem(payload, exceptions.get(index, outcome))
            for index, payload in enumerate(self.broker_payloads)
        ]


class IdRange(Sequence[Hashable]):
    """Event ids that count up by one: ``IdRange(prefix, first, length)[i]`` is
    ``(*prefix, first + i)``. Kafka's ids, ``(topic, partition, offset)``, are one
    when a fetch's offsets have no gap.

    Give one as an :class:`EventBatch`'s ``event_ids`` when it fits: the group then
    remembers who handled the batch's events as one interval, not one entry per id.
    It compares equal to the list of the same ids.
    """

    __slots__ = ("first", "length", "prefix")

    def __init__(self, prefix: tuple[Hashable, ...], first: int, length: int) -> None:
        if not isinstance(prefix, tuple):
            raise TypeError(f"prefix must be a tuple, got {type(prefix).__name__}")
        if type(first) is not int or type(length) is not int or length < 0:
            raise ValueError(
                f"first must be an int and length an int >= 0, got {first!r}, {length!r}"
            )
        self.prefix = prefix
        self.first = first
        self.length = length

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> Hashable: ...
    @overload
    def __getitem__(self, index: slice) -> IdRange: ...
    def __getitem__(self, index: int | slice) -> Hashable | IdRange:
        if isinstance(index, slice):
            first, stop, step = index.indices(self.length)
            if step != 1:
                raise ValueError("an IdRange slices with step 1 only")
            return IdRange(self.prefix, self.first + first, max(0, stop - first))
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError("IdRange index out of range")
        return (*self.prefix, self.first + index)

    def __iter__(self) -> Iterator[Hashable]:
        prefix = self.prefix
        for offset in range(self.first, self.first + self.length):
            yield (*prefix, offset)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdRange):
            return (self.prefix, self.first, self.length) == (
                other.prefix,
                other.first,
                other.length,
            )
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == self.length and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdRange({self.prefix!r}, {self.first}, {self.length})"
