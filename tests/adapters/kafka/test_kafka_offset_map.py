"""The offset map's encoding (no broker): what round-trips, what is bounded, what is
refused. The broker-side behaviour is in test_kafka_attempts.py and
test_kafka_member_progress.py."""

from __future__ import annotations

import base64
import zlib
from typing import Any

import pytest

from ackgate_kafka._offset_map import (
    MAX_MEMBER_SPAN,
    MAX_METADATA,
    PREFIX,
    OffsetRuns,
    decode,
    encode,
)


def runs(*pairs: tuple[int, int]) -> OffsetRuns:
    return OffsetRuns(iter(pairs))


def encoded(*args: Any, **options: Any) -> str:
    """The metadata, asserting that all of it fit."""
    text, complete = encode(*args, **options)
    assert complete
    return text


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
    text = encoded("orders", 2, 100, runs((103, 105), (106, 5000)), 5200, counts)
    assert text.startswith(PREFIX) and len(text) < 100
    got = decode(text, "orders", 2, 100)
    assert not isinstance(got, str)
    assert list(got.finished.runs()) == [(103, 105), (106, 5000)]
    assert got.delivered_next == 5200
    assert dict(got.counts) == counts


def test_entries_below_the_committed_offset_are_left_out() -> None:
    text = encoded("t", 0, 50, runs((10, 20), (40, 60)), 70, {30: 2, 55: 4})
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
    text = encoded("t", 0, 7, runs((9, 12)), 12, {})
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
    raw = bytearray(base64.b64decode(encoded("t", 0, 7, runs((9, 12)), 12, {})[len(PREFIX) :]))
    raw[5] ^= 0x01
    assert decode(PREFIX + base64.b64encode(bytes(raw)).decode(), "t", 0, 7) == (
        "checksum mismatch"
    )


def test_the_map_stays_under_the_bound_by_leaving_out_the_farthest_runs() -> None:
    # Every other offset finished, and every other one delivered many times: far more
    # runs than fit.
    finished = OffsetRuns(iter((o, o + 1) for o in range(1_001, 201_000, 2)))
    counts = {o: 2 + o % 7 for o in range(1_000, 201_000, 2)}
    text, complete = encode("t", 0, 1_000, finished, 201_000, counts)
    assert len(text) <= MAX_METADATA and not complete
    got = decode(text, "t", 0, 1_000)
    assert not isinstance(got, str)
    kept = list(got.finished.runs())
    assert kept[0] == (1_001, 1_002) and len(kept) > 300
    assert all(finished.__contains__(start) for start, _ in kept)  # a prefix, nothing made up
    assert got.counts and all(counts[o] == n for o, n in got.counts.items())
    assert min(got.counts) == 1_000


def test_what_each_member_acked_round_trips_less_the_finished_offsets() -> None:
    members = {
        "indexer": [(100, 180), (200, 210)],
        "auditor": [(101, 120)],
        "notifier": [],
        "\u00e9v\u00e9nements": [(150, 151)],
    }
    text = encoded("orders", 3, 100, runs((105, 110)), 210, {100: 2}, members)
    got = decode(text, "orders", 3, 100)
    assert not isinstance(got, str)
    assert list(got.finished.runs()) == [(105, 110)]
    assert dict(got.members) == {
        "indexer": [(100, 105), (110, 180), (200, 210)],  # the committed offset included
        "auditor": [(101, 105), (110, 120)],
        "notifier": [],
        "\u00e9v\u00e9nements": [(150, 151)],
    }


def test_a_first_version_map_is_still_read_without_members() -> None:
    text = encoded("t", 0, 7, runs((9, 12)), 12, {})
    # Version 1 had no member section: its body is this one's without the count of 0.
    raw = base64.b64decode(text[len(PREFIX) :])[:-4]
    assert raw[-1] == 0
    body = raw[:-1]
    first_version = (
        "ackgate1:" + base64.b64encode(body + zlib.crc32(body).to_bytes(4, "big")).decode()
    )
    got = decode(first_version, "t", 0, 7)
    assert not isinstance(got, str)
    assert list(got.finished.runs()) == [(9, 12)] and not got.members


def test_members_that_do_not_fit_lose_their_farthest_runs_and_say_so() -> None:
    # Every other offset acked by each of three members: far more runs than fit.
    members = {sid: [(o, o + 1) for o in range(0, 100_000, 2)] for sid in ("a", "b", "c")}
    text, complete = encode("t", 0, 0, OffsetRuns(), 100_000, {}, members, 1_000)
    assert not complete and len(text) <= 1_000
    got = decode(text, "t", 0, 0, 1_000)
    assert not isinstance(got, str)
    assert set(got.members) == {"a", "b", "c"}
    for sid in ("a", "b", "c"):
        kept = got.members[sid]
        assert kept[0] == (0, 1) and len(kept) > 50  # the nearest kept, a fair share each
        assert set(kept) <= set(members[sid])  # nothing made up


def test_member_ids_too_long_for_the_bound_leave_the_members_out() -> None:
    text, complete = encode("t", 0, 0, OffsetRuns(), 10, {}, {"x" * 500: [(0, 5)]}, 256)
    assert not complete and len(text) <= 256
    got = decode(text, "t", 0, 0, 256)
    assert not isinstance(got, str) and not got.members


def test_a_members_runs_far_past_the_commit_are_not_trusted() -> None:
    far = MAX_MEMBER_SPAN
    text = encoded("t", 0, 10, OffsetRuns(), 10, {}, {"a": [(10, 20), (far, far + 50)]})
    got = decode(text, "t", 0, 10)
    assert not isinstance(got, str)
    assert got.members["a"] == [(10, 20), (far, far + 10)]  # clipped at 10 + MAX_MEMBER_SPAN


def _with_members(body: bytes) -> str:
    """A version-2 map of ``t``-0@0 with no counts and no finished runs, then ``body``
    as its member section, and a valid checksum: only the members are malformed."""
    out = bytearray()
    for value in (0, 0, zlib.crc32(b"t"), 0, 0, 0):
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    out += body
    return PREFIX + base64.b64encode(bytes(out) + zlib.crc32(out).to_bytes(4, "big")).decode()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (bytes([1, 2]) + b"\xff\xfe" + bytes([0]), "not UTF-8"),
        (bytes([2, 1]) + b"a" + bytes([0, 1]) + b"a" + bytes([0]), "listed twice"),
        (bytes([1, 1]) + b"a" + bytes([1, 0, 0]), "empty"),
        (bytes([1, 1]) + b"a" + bytes([2, 0, 5, 0, 5]), "touches"),
        (bytes([1, 1]) + b"a" + bytes([3, 0, 5]), "truncated"),
        (bytes([1, 9]) + b"a", "truncated"),
        (bytes([1, 1]) + b"a" + bytes([0, 7]), "trailing"),
    ],
)
def test_a_malformed_member_section_ignores_the_whole_map(body: bytes, why: str) -> None:
    assert not isinstance(decode(_with_members(bytes([0])), "t", 0, 0), str)  # the frame is valid
    got = decode(_with_members(body), "t", 0, 0)
    assert isinstance(got, str) and why in got
