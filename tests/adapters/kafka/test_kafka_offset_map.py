"""The offset map's encoding (no broker): what round-trips, what is bounded, what is
refused. The broker-side behaviour is in test_kafka_attempts.py."""

from __future__ import annotations

import base64

import pytest

from ackgate_kafka._offset_map import MAX_METADATA, PREFIX, OffsetRuns, decode, encode


def runs(*pairs: tuple[int, int]) -> OffsetRuns:
    return OffsetRuns(iter(pairs))


def test_runs_merge_touching_and_overlapping_additions() -> None:
    finished = OffsetRuns()
    for offset in (5, 7, 6, 10, 3, 4, 11):
        finished.add(offset)
    finished.add_run(20, 30)
    finished.add_run(25, 40)
    assert list(finished.runs()) == [(3, 8), (10, 12), (20, 40)]
    assert 7 in finished and 8 not in finished and 39 in finished and 40 not in finished
    assert finished.take_from(3) == 8 and finished.take_from(9) == 9
    finished.drop_below(25)
    assert list(finished.runs()) == [(25, 40)]


def test_a_commit_moves_past_a_run_even_with_older_runs_below_it() -> None:
    # Runs below the commit point (finished while an earlier offset held the commit)
    # must not hide the run that starts at it.
    finished = runs((13, 37), (38, 62), (63, 487), (488, 500))
    assert finished.take_from(488) == 500
    assert not finished


def test_a_map_round_trips_for_its_own_partition_and_offset() -> None:
    counts = {100: 3, 101: 2, 102: 2, 105: 2}
    text = encode("orders", 2, 100, runs((103, 105), (106, 5000)), 5200, counts)
    assert text.startswith(PREFIX) and len(text) < 100
    got = decode(text, "orders", 2, 100)
    assert not isinstance(got, str)
    assert list(got.finished.runs()) == [(103, 105), (106, 5000)]
    assert got.delivered_next == 5200
    assert dict(got.counts) == counts


def test_entries_below_the_committed_offset_are_left_out() -> None:
    text = encode("t", 0, 50, runs((10, 20), (40, 60)), 70, {30: 2, 55: 4})
    got = decode(text, "t", 0, 50)
    assert not isinstance(got, str)
    assert list(got.finished.runs()) == [(51, 60)]  # never the committed offset itself
    assert dict(got.counts) == {55: 4}


@pytest.mark.parametrize(
    ("topic", "partition", "committed", "why"),
    [
        ("other", 0, 7, "another topic"),
        ("t", 1, 7, "another partition"),
        ("t", 0, 8, "committed offset"),
    ],
)
def test_a_map_of_another_topic_partition_or_offset_is_ignored(
    topic: str, partition: int, committed: int, why: str
) -> None:
    text = encode("t", 0, 7, runs((9, 12)), 12, {})
    got = decode(text, topic, partition, committed)
    assert isinstance(got, str) and why in got


@pytest.mark.parametrize(
    "metadata",
    [
        "",
        "garbage",
        "ackgate0:AAAA",
        PREFIX + "!!!not base64",
        PREFIX + base64.b64encode(b"\x00\x07\x01\x02").decode(),
        PREFIX + "A" * MAX_METADATA,
    ],
)
def test_garbage_is_ignored_with_a_reason(metadata: str) -> None:
    assert isinstance(decode(metadata, "t", 0, 7), str)


def test_a_flipped_bit_is_caught_by_the_checksum() -> None:
    raw = bytearray(base64.b64decode(encode("t", 0, 7, runs((9, 12)), 12, {})[len(PREFIX) :]))
    raw[5] ^= 0x01
    assert decode(PREFIX + base64.b64encode(bytes(raw)).decode(), "t", 0, 7) == (
        "checksum mismatch"
    )


def test_the_map_stays_under_the_bound_by_leaving_out_the_farthest_runs() -> None:
    # Every other offset finished, and every other one delivered many times: far more
    # runs than fit.
    finished = OffsetRuns(iter((o, o + 1) for o in range(1_001, 201_000, 2)))
    counts = {o: 2 + o % 7 for o in range(1_000, 201_000, 2)}
    text = encode("t", 0, 1_000, finished, 201_000, counts)
    assert len(text) <= MAX_METADATA
    got = decode(text, "t", 0, 1_000)
    assert not isinstance(got, str)
    kept = list(got.finished.runs())
    assert kept[0] == (1_001, 1_002) and len(kept) > 300
    assert all(finished.__contains__(start) for start, _ in kept)  # a prefix, nothing made up
    assert got.counts and all(counts[o] == n for o, n in got.counts.items())
    assert min(got.counts) == 1_000
