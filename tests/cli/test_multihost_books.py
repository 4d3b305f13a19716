"""The checks benchmarks/multihost makes of its records (CI runs the benchmark's quick
mode; here, that its books catch what they are there to catch)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

MULTIHOST = Path(__file__).resolve().parents[2] / "benchmarks" / "multihost"


@pytest.fixture
def accounting() -> Iterator[ModuleType]:
    sys.path.insert(0, str(MULTIHOST))
    try:
        import accounting

        yield accounting
    finally:
        sys.path.remove(str(MULTIHOST))
        sys.modules.pop("accounting", None)


def write(directory: Path, name: str, lines: list[str]) -> None:
    (directory / name).write_text("".join(f"{line}\n" for line in lines))


def test_a_redelivery_is_a_duplicate_and_a_skip_ahead_is_disorder(
    accounting: ModuleType, tmp_path: Path
) -> None:
    # Host a handled k1's 0..2 and died; host b took over from 1 (a redelivery of 1, 2).
    write(tmp_path, "a-1.log", [f"indexer 0 {n} k1 {n} {10 + n}" for n in range(3)])
    write(tmp_path, "b-2.log", [f"indexer 0 {n} k1 {n} {20 + n}" for n in range(1, 5)])
    # The notifier's first delivery of k2's 1 came before that of its 0.
    write(tmp_path, "c-3.log", ["notifier 1 1 k2 1 5", "notifier 1 0 k2 0 6"])
    books = accounting.Records.read(tmp_path)
    assert books.duplicates() == {"indexer": 2, "auditor": 0, "notifier": 0}
    assert books.order_violations() == {"indexer": 0, "auditor": 0, "notifier": 1}
    assert books.missing({(0, n) for n in range(6)})["indexer"] == 1  # offset 5


def test_recovery_waits_for_every_partition_left_to_consume(accounting: ModuleType) -> None:
    timeline = accounting.Timeline()
    timeline.add(1.0, {0: 10, 1: 10}, {})
    timeline.add(2.0, {0: 12, 1: 10}, {})  # the fault takes hold at 1.5: this is the baseline
    timeline.add(3.0, {0: 14, 1: 10}, {})
    timeline.add(4.5, {0: 15, 1: 11}, {})
    assert timeline.recovery(1.2, 1.5, {0: 20, 1: 20}) == pytest.approx(3.3)
    assert timeline.recovery(1.2, 1.5, {0: 20, 1: 10}) == pytest.approx(1.8)  # 1 was done
    assert timeline.recovery(1.2, 4.0, {0: 20, 1: 20}).startswith("never")
