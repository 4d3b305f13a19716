"""What one advance call means for one partition, decided without I/O.

:func:`plan` reads the runs ackgate resolved (``advance`` items are grouped into runs
of equal outcomes first) and returns an :class:`AdvancePlan`: where the commit may
move, where the partition must be held, which offsets past a hold are finished, which
records go to the DLQ. :class:`~ackgate_kafka.KafkaStreamProducer` then carries it
out (DLQ writes, then the commit or hold under its lock). The rules are those of
:mod:`ackgate_kafka._producer`; this module only makes a clean run cost O(1).

Why a run can be decided from its ends: a partition's epoch only grows, and it is
read at fetch time, so the deliveries of a lane arrive here with non-decreasing
epochs, and within one epoch with increasing offsets that skip only offsets the log
does not hold (compaction, transaction markers) or the offset map already finished.
A run whose first and last deliveries share an epoch is therefore all of that epoch,
and committing past its last offset is what committing past each of them in turn
would do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ackgate import AdvanceItem, AdvanceOutcome, AdvanceRun
from ackgate_kafka._partitions import Delivery


@dataclass(slots=True)
class AdvancePlan:
    """What to do for one advance call of one partition.

    ``commit_to`` is the offset after the last committable delivery of the current
    epoch (before any hold); ``hold_at`` the first failed or unsubscribed offset of the
    current epoch; ``finished`` the runs ``[start, end)`` of clean offsets past the
    hold or fetched in an earlier epoch of this assignment; ``rejected`` the rejected
    deliveries to dead-letter (or drop with a warning) before committing past them;
    ``stale`` how many deliveries were of an earlier epoch.
    """

    commit_to: int | None = None
    hold_at: int | None = None
    finished: list[tuple[int, int]] = field(default_factory=list)
    rejected: list[tuple[Delivery, AdvanceOutcome]] = field(default_factory=list)
    stale: int = 0


def as_runs(items: Sequence[AdvanceItem]) -> list[AdvanceRun]:
    """``advance`` items as runs of equal consecutive outcomes, so both forms of
    advance share :func:`plan` (and its O(1) clean run)."""
    runs: list[AdvanceRun] = []
    start = 0
    outcome = items[0].outcome
    for index in range(1, len(items)):
        following = items[index].outcome
        if following is not outcome and following != outcome:
            runs.append(AdvanceRun([item.broker_payload for item in items[start:index]], outcome))
            start, outcome = index, following
    runs.append(AdvanceRun([item.broker_payload for item in items[start:]], outcome))
    return runs


def plan(runs: Iterable[AdvanceRun], epoch: int, assigned_epoch: int) -> AdvancePlan:
    """Decide the advance of ``runs`` (one partition, in stream order) for a partition
    now in ``epoch``, assigned in ``assigned_epoch``."""
    result = AdvancePlan()
    for run in runs:
        payloads = run.broker_payloads
        first: Delivery = payloads[0]
        last: Delivery = payloads[-1]
        if not run.exceptions and first.epoch == last.epoch:
            _whole(result, payloads, run.outcome, first, last, epoch, assigned_epoch)
        else:
            for index, delivery in enumerate(payloads):
                _whole(
                    result,
                    (delivery,),
                    run.outcome_of(index),
                    delivery,
                    delivery,
                    epoch,
                    assigned_epoch,
                )
    return result


def _whole(
    result: AdvancePlan,
    deliveries: Sequence[Any],
    outcome: AdvanceOutcome,
    first: Delivery,
    last: Delivery,
    epoch: int,
    assigned_epoch: int,
) -> None:
    """Add ``deliveries``, all of one epoch and all with ``outcome``, to ``result``."""
    current = first.epoch == epoch
    if not current:
        result.stale += len(deliveries)
    if outcome.failed or not (outcome.acked or outcome.rejected):
        # Held: the first failed or unsubscribed delivery of the current epoch is where
        # the partition is sought back to; later ones are fetched again from there.
        if current and result.hold_at is None:
            result.hold_at = first.record.offset
        return
    # Clean (acked, or rejected with nobody failing). Past a hold, or fetched before one
    # (stale), it is finished: the map names only offsets whose advance was clean, as a
    # commit past them would be. An earlier assignment's owner decides about its own.
    if first.epoch < assigned_epoch:
        return
    if outcome.rejected:
        result.rejected.extend((delivery, outcome) for delivery in deliveries)
    start, end = first.record.offset, last.record.offset + 1
    # One epoch's offsets increase (module docstring): the run spans at least its own
    # length. tests/adapters/kafka/test_kafka_advance_plan.py.
    assert end - start >= len(deliveries), (start, end, len(deliveries))
    if current and result.hold_at is None:
        result.commit_to = end
    elif end - start == len(deliveries):
        result.finished.append((start, end))
    else:
        # Gaps in the offsets (compaction, transaction markers, offsets already
        # finished): only the offsets that were delivered are finished here.
        result.finished.extend(
            (delivery.record.offset, delivery.record.offset + 1) for delivery in deliveries
        )
