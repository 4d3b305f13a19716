"""``DeliveryCounts``: deliveries per event id for producers whose broker counts none
(``Message.attempt``, docs/failure-semantics.md#poison-messages), bounded by forgetting the
oldest ids."""

from __future__ import annotations

import pytest

from ackgate import DeliveryCounts


def test_counts_deliveries_per_id() -> None:
    counts = DeliveryCounts()
    assert counts.get("a") == 0
    assert [counts.add("a"), counts.add("b"), counts.add("a"), counts.add("a")] == [1, 1, 2, 3]
    assert (counts.get("a"), counts.get("b"), len(counts)) == (3, 1, 2)


def test_forgets_the_oldest_ids_beyond_capacity() -> None:
    counts = DeliveryCounts(capacity=2)
    counts.add("a")
    counts.add("a")
    counts.add("b")
    counts.add("c")  # "a" was first seen longest ago: forgotten
    assert (counts.get("a"), counts.get("b"), counts.get("c"), len(counts)) == (0, 1, 1, 2)
    assert counts.add("a") == 1


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_capacity_is_an_int_of_at_least_1(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        DeliveryCounts(capacity=capacity)  # type: ignore[arg-type]
