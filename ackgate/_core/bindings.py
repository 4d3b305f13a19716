"""Bound outputs: derived outputs tied to the raw event they were derived from.

A subscriber's part in an event resolves as ``acked`` only once its window on the
event is closed *and* every output it bound inside that window was confirmed
persisted. The registry maps each sequence number to ``(subscription, target)``,
the target being one event of a run, ``(run, index)``, or a :class:`BatchBinding`;
the subscription counts its unconfirmed outputs per event (``_outputs``).

An entry is *live* while its event is still in its subscription's ``_outputs``
(a batch binding: while it is in the subscription's ``_batches``).
When an event resolves another way (rejected, failed, by any of its numbers or
none) its numbers go *stale*: they stay in the registry until confirmed or swept,
so dropping them costs nothing on the hot path, and the sweep keeps the registry
no larger than twice its live part. When a group stops, its numbers go stale and
are swept at once, so the registry never keeps a stopped group alive.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol, TypeAlias

from ackgate._core.fanout import Resolution, Run

_SWEEP_MINIMUM = 1024

#: One event as a binding target: the run itself for a run of one event (an event
#: yielded alone), else ``(run, index)``.
EventRef: TypeAlias = Run | tuple[Run, int]


class BoundBatch(NamedTuple):
    """What :meth:`Subscription.pull_batch` hands out: events and their one number."""

    #: The raw events, in stream order.
    events: list[Any]
    #: One sequence number bound to all of them: ``confirm_persisted([seq])`` acks
    #: them all, ``reject_bound`` / ``fail_bound`` resolve them all, and
    #: ``manager.reject_in_batch(seq, indexes)`` rejects some (by index in ``events``).
    seq: int


class BatchBinding:
    """One output bound to several events of one subscriber at once (``pull_batch``):
    ``slices`` of runs, ``(run, start, stop)``, in stream order.

    Invariant: an event of the binding is resolved for the subscriber either with
    the whole binding or, before that, alone (its batch index in ``apart``), never
    twice. The binding holds one of its subscriber's holds on each run of
    ``slices`` (``Subscription._parts``) until it is resolved.
    """

    __slots__ = ("apart", "size", "slices")

    def __init__(self, slices: list[tuple[Run, int, int]]) -> None:
        self.slices = slices
        self.size = sum(stop - start for _, start, stop in slices)
        #: Batch indexes of the events already resolved alone (``reject_in_batch``).
        self.apart: set[int] | None = None

    def set_apart(self, index: int) -> tuple[Run, int, bool]:
        """Resolve the batch's ``index``-th event alone (``reject_in_batch``). Returns
        its run and run index, and whether every event of its slice is now apart: the
        binding then holds nothing of the run any more."""
        apart = self.apart
        if apart is None:
            apart = self.apart = set()
        apart.add(index)
        offset = 0
        for run, start, stop in self.slices:
            size = stop - start
            if index < offset + size:
                done = all(i in apart for i in range(offset, offset + size))
                return run, start + index - offset, done
            offset += size
        raise IndexError(index)

    def remaining(self) -> list[tuple[Run, int, int, list[int] | None]]:
        """Per slice: ``(run, start, stop, indexes)``, where ``indexes`` lists the run
        indexes the binding still resolves, or is ``None`` when that is all of
        ``start .. stop - 1``."""
        apart = self.apart
        found: list[tuple[Run, int, int, list[int] | None]] = []
        offset = 0
        for run, start, stop in self.slices:
            if apart is None:
                found.append((run, start, stop, None))
            else:
                indexes = [start + i for i in range(stop - start) if offset + i not in apart]
                found.append((run, start, stop, indexes))
            offset += stop - start
        return found

    def owes_event(self, run: Run, index: int) -> bool:
        """Whether the binding still resolves the event at ``index`` of ``run``."""
        offset = 0
        for slice_run, start, stop in self.slices:
            if slice_run is run and start <= index < stop:
                return self.apart is None or offset + index - start not in self.apart
            offset += stop - start
        return False


class OutputOwner(Protocol):
    """The side of a subscription (``ackgate._core.subscription``) that its numbers
    reach: what it still owes per event and per batch, and how it resolves them."""

    _outputs: dict[EventRef, int]
    _batches: dict[BatchBinding, None]

    def _output_confirmed(self, target: EventRef | BatchBinding) -> bool: ...

    def _output_resolved(
        self, target: EventRef | BatchBinding, how: Resolution, reason: str | None
    ) -> int | None: ...

    def _batch_part_rejected(
        self, batch: BatchBinding, indexes: list[object], reason: str | None
    ) -> bool | None: ...


class OutputRegistry:
    """Sequence numbers of one manager. Numbers are unique per manager and start at 1."""

    __slots__ = ("_by_seq", "_next_seq", "_stale")

    def __init__(self) -> None:
        self._by_seq: dict[int, tuple[OutputOwner, EventRef | BatchBinding]] = {}
        self._next_seq = 1
        self._stale = 0  # an upper bound of the stale entries in _by_seq

    def bind(self, subscription: OutputOwner, target: EventRef | BatchBinding) -> int:
        seq = self._next_seq
        self._next_seq = seq + 1
        self._by_seq[seq] = (subscription, target)
        return seq

    def confirm(self, seqs: Iterable[object]) -> None:
        """Mark outputs persisted. Anything that is not a live sequence number is ignored."""
        by_seq = self._by_seq
        for seq in seqs:
            if type(seq) is not int:  # bool, str, None, unhashables: never a sequence number
                continue
            entry = by_seq.pop(seq, None)
            if entry is not None and not entry[0]._output_confirmed(entry[1]):
                self._stale -= 1

    def resolve(self, seqs: Iterable[object], how: Resolution, reason: str | None) -> None:
        """Resolve the event each live number is bound to as ``how`` for its
        subscriber (the first resolution wins). Anything else is ignored."""
        gone = 0
        for seq in seqs:
            if type(seq) is not int:
                continue
            entry = self._by_seq.pop(seq, None)
            if entry is None:
                continue
            others = entry[0]._output_resolved(entry[1], how, reason)
            if others is None:
                self._stale -= 1
            else:
                gone += others
        self.abandoned(gone)

    def reject_in_batch(self, indexes: list[object], seq: object, reason: str | None) -> None:
        """Reject the events at ``indexes`` of the batch bound to ``seq``, each alone.
        Numbers that are not a live batch binding are ignored."""
        if type(seq) is not int:
            return
        entry = self._by_seq.get(seq)
        if entry is None or type(entry[1]) is not BatchBinding:
            return
        finished = entry[0]._batch_part_rejected(entry[1], indexes, reason)
        if finished is None or finished:
            del self._by_seq[seq]
            if finished is None:
                self._stale -= 1

    def abandoned(self, count: int, *, sweep: bool = False) -> None:
        """``count`` numbers went stale: their event resolved without them.

        ``sweep`` (a group stopped) drops every stale entry now, so none keeps its
        subscription, and so its group, alive: O(registry) once per stop.
        """
        self._stale += count
        if (sweep and self._stale > 0) or (
            self._stale >= _SWEEP_MINIMUM and 2 * self._stale >= len(self._by_seq)
        ):
            self._by_seq = {
                seq: entry
                for seq, entry in self._by_seq.items()
                if entry[1] in entry[0]._outputs or entry[1] in entry[0]._batches
            }
            self._stale = 0
