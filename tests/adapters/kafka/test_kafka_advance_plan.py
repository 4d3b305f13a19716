"""The Kafka adapter's advance decision and batch ids, without a broker.

``plan`` decides what an advance does to one partition (commit target, hold, finished
offsets, DLQ copies); ``event_ids`` decides whether a batch's ids are one interval.
The broker-side effects of the same decisions are in test_kafka_advance_runs.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any, overload

import pytest

from ackgate import AdvanceItem, AdvanceOutcome, AdvanceRun, IdRange
from ackgate_kafka._advance import AdvancePlan, as_runs, plan
from ackgate_kafka._fetch import event_ids
from ackgate_kafka._partitions import Delivery

ACK = AdvanceOutcome(acked=2, failed=0, rejected=0)
FAIL = AdvanceOutcome(acked=1, failed=1, rejected=0)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)
REJECT = AdvanceOutcome(acked=1, failed=0, rejected=1, reasons=("s0: bad",))
TP = SimpleNamespace(topic="t", partition=3)


def deliveries(offsets: Sequence[int], epoch: int = 2) -> list[Delivery]:
    return [
        Delivery(TP, SimpleNamespace(topic="t", partition=3, offset=o), epoch, 1) for o in offsets
    ]


def finished(decided: AdvancePlan) -> set[int]:
    return {offset for start, end in decided.finished for offset in range(start, end)}


class EndsOnly(Sequence[Any]):
    """A run's payloads that fail the test if anything but the first and last is read."""

    def __init__(self, items: list[Delivery]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        assert isinstance(index, int) and index in (0, -1, len(self) - 1), index
        return self._items[index]

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("a clean run was read event by event")


def test_a_clean_run_is_decided_from_its_ends() -> None:
    run = AdvanceRun(EndsOnly(deliveries(range(100, 356))), ACK)
    decided = plan([run], epoch=2, assigned_epoch=1)
    assert (decided.commit_to, decided.hold_at, decided.finished) == (356, None, [])
    assert (decided.rejected, decided.stale) == ([], 0)


def test_a_failure_inside_a_run_holds_there_and_finishes_nothing_before_it() -> None:
    run = AdvanceRun(deliveries(range(10, 20)), ACK, {3: FAIL, 6: NOBODY})
    decided = plan([run], epoch=2, assigned_epoch=1)
    # Committed up to the failure; what follows it in this epoch is finished (the
    # unsubscribed 16 is fetched again from the hold, like the failed 13).
    assert (decided.commit_to, decided.hold_at) == (13, 13)
    assert decided.finished == [(14, 15), (15, 16), (17, 18), (18, 19), (19, 20)]


def test_a_clean_run_after_a_hold_is_finished_as_one_interval_or_per_offset() -> None:
    held = AdvanceRun(deliveries([5]), FAIL)
    contiguous = AdvanceRun(deliveries(range(6, 9)), ACK)
    gapped = AdvanceRun(deliveries([9, 12, 13]), ACK)  # 10, 11: compacted away
    decided = plan([held, contiguous, gapped], epoch=2, assigned_epoch=1)
    assert (decided.commit_to, decided.hold_at) == (None, 5)
    assert decided.finished == [(6, 9), (9, 10), (12, 13), (13, 14)]


def test_rejects_inside_a_run_are_dead_lettered_with_their_outcome_and_committed_past() -> None:
    payloads = deliveries(range(4))
    decided = plan([AdvanceRun(payloads, ACK, {1: REJECT})], epoch=2, assigned_epoch=1)
    assert decided.rejected == [(payloads[1], REJECT)]
    assert (decided.commit_to, decided.hold_at) == (4, None)


def test_a_run_of_an_earlier_epoch_is_not_committed_but_finished_if_clean() -> None:
    stale = AdvanceRun(deliveries(range(6, 10), epoch=2), ACK)
    decided = plan([stale], epoch=3, assigned_epoch=1)
    assert (decided.commit_to, decided.hold_at, decided.stale) == (None, None, 4)
    assert decided.finished == [(6, 10)]
    # One of an earlier assignment is left to that assignment's owner.
    decided = plan([stale], epoch=3, assigned_epoch=3)
    assert (decided.commit_to, decided.finished, decided.stale) == (None, [], 4)


def test_a_run_straddling_two_epochs_is_decided_event_by_event() -> None:
    # Fetched before a hold at 5 (epoch 2), then 5.. again after it (epoch 3).
    straddling = AdvanceRun(deliveries([6, 7], epoch=2) + deliveries([5, 6, 7], epoch=3), ACK)
    decided = plan([straddling], epoch=3, assigned_epoch=1)
    assert (decided.commit_to, decided.hold_at, decided.stale) == (8, None, 2)
    assert decided.finished == [(6, 7), (7, 8)]


@pytest.mark.parametrize(
    "outcomes",
    [
        [ACK] * 5,
        [ACK, ACK, FAIL, ACK, ACK],
        [ACK, REJECT, REJECT, ACK, NOBODY],
        [FAIL, ACK, FAIL, ACK, ACK],
    ],
)
def test_advance_items_and_runs_plan_alike(outcomes: list[AdvanceOutcome]) -> None:
    payloads = deliveries(range(20, 25))
    items = [AdvanceItem(p, o) for p, o in zip(payloads, outcomes, strict=True)]
    runs = as_runs(items)
    assert [item for run in runs for item in run.items()] == items
    one_run = AdvanceRun(payloads, ACK, {i: o for i, o in enumerate(outcomes) if o != ACK})
    by_items, by_run = plan(runs, 2, 1), plan([one_run], 2, 1)
    assert (by_items.commit_to, by_items.hold_at, by_items.rejected, by_items.stale) == (
        by_run.commit_to,
        by_run.hold_at,
        by_run.rejected,
        by_run.stale,
    )
    assert finished(by_items) == finished(by_run)


def test_contiguous_offsets_are_one_id_interval() -> None:
    records = [SimpleNamespace(offset=o) for o in range(40, 296)]
    ids = event_ids(TP, records)
    assert isinstance(ids, IdRange)
    assert (ids.prefix, ids.first, len(ids)) == (("t", 3), 40, 256)
    assert ids == [("t", 3, o) for o in range(40, 296)]


def test_offsets_with_a_gap_are_one_id_per_record() -> None:
    records = [SimpleNamespace(offset=o) for o in (40, 41, 43)]  # 42: compacted away
    ids = event_ids(TP, records)
    assert not isinstance(ids, IdRange)
    assert ids == [("t", 3, 40), ("t", 3, 41), ("t", 3, 43)]
