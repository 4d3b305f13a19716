"""The offset map: what a partition's commit metadata tells its next owner.

Kafka commits one offset per partition, so a failed offset holds the commit while the
offsets after it are handled. The map, written in the metadata of every commit
(``OffsetAndMetadata.metadata``), records past the committed offset ``C``:

* **finished** offsets: advanced clean (acked by every subscriber, or rejected and
  dead-lettered), as runs. The next owner does not deliver them again and commits
  past them once the offsets before them are committed.
* **deliveries**: ``delivered_next`` (every offset in ``[C, delivered_next)`` not
  listed otherwise was delivered once) and runs of offsets delivered more than once
  with their count, so ``Message.attempt`` keeps counting across owners and
  restarts.

Encoding: ``"ackgate1:"`` + base64 of unsigned LEB128 varints: partition, ``C``, the
CRC-32 of the topic, ``delivered_next - C``, the count runs ``(gap, length,
deliveries)``, the finished runs ``(gap, length)`` (each gap from the end of the
previous run; for finished runs, which never touch, from one past it, and the first
from ``C + 1``), then a CRC-32 of all of it.
At most :data:`MAX_METADATA` characters (Kafka refuses metadata over
``offset.metadata.max.bytes``, 4096 by default): the runs farthest from ``C`` are
left out when they do not fit, which only costs duplicates.

:func:`decode` trusts a map only when it is this version, for this topic, partition
and committed offset, intact (checksum) and bounded; anything else is ignored, so
the worst a bad map does is leave offsets to be delivered again.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

PREFIX = "ackgate1:"
MAX_METADATA = 4000
# Raw bytes that fit in MAX_METADATA once base64-encoded, less the trailing checksum.
_RAW_BUDGET = (MAX_METADATA - len(PREFIX)) // 4 * 3 - 4
# Count runs get at most a third of the room: the finished runs save more work.
_COUNTS_BUDGET = _RAW_BUDGET // 3
# Offsets a map may list with a count: expanded into a dict on load, so bounded.
MAX_COUNTED = 65_536
_MAX_OFFSET = 2**63 - 1


class OffsetRuns:
    """A set of offsets kept as sorted, disjoint, non-adjacent runs ``[start, end)``.

    A poison offset with everything after it finished is one run, however long.
    Invariant: ``_starts`` and ``_ends`` have equal lengths, ``_starts[i] < _ends[i]
    < _starts[i + 1]``.
    """

    __slots__ = ("_ends", "_starts")

    def __init__(self, runs: Iterator[tuple[int, int]] | None = None) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in runs or ():
            self.add_run(start, end)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def runs(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def add(self, offset: int) -> None:
        self.add_run(offset, offset + 1)

    def add_run(self, start: int, end: int) -> None:
        starts, ends = self._starts, self._ends
        i = bisect_right(starts, start) - 1
        if i >= 0 and ends[i] >= start:  # overlaps or touches the run before
            start = starts[i]
        else:
            i += 1
        j = i
        while j < len(starts) and starts[j] <= end:  # swallow the runs it reaches
            end = max(end, ends[j])
            j += 1
        assert start < end
        starts[i:j] = [start]
        ends[i:j] = [end]

    def take_from(self, offset: int) -> int:
        """Where a commit at ``offset`` can move to: the end of the run holding
        ``offset`` (``offset`` if none). Everything below that end is removed."""
        self.drop_below(offset)
        if self._starts and self._starts[0] == offset:
            self._starts.pop(0)
            return self._ends.pop(0)
        return offset

    def drop_below(self, offset: int) -> None:
        while self._starts and self._ends[0] <= offset:
            self._starts.pop(0)
            self._ends.pop(0)
        if self._starts and self._starts[0] < offset:
            self._starts[0] = offset


@dataclass(frozen=True, slots=True)
class OffsetMap:
    """A decoded map (every offset in it is at or after the committed one)."""

    finished: OffsetRuns
    delivered_next: int
    counts: Mapping[int, int]


def _varint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _count_runs(counts: Mapping[int, int], committed: int) -> Iterator[tuple[int, int, int]]:
    """``(start, end, deliveries)`` over consecutive offsets with equal counts."""
    run: list[int] | None = None
    for offset in sorted(o for o in counts if o >= committed):
        n = counts[offset]
        if run is not None and offset == run[1] and n == run[2]:
            run[1] += 1
            continue
        if run is not None:
            yield run[0], run[1], run[2]
        run = [offset, offset + 1, n]
    if run is not None:
        yield run[0], run[1], run[2]


def encode(
    topic: str,
    partition: int,
    committed: int,
    finished: OffsetRuns,
    delivered_next: int,
    counts: Mapping[int, int],
) -> str:
    """The metadata of a commit at ``committed`` (entries below it are left out)."""
    out = bytearray()
    for value in (partition, committed, zlib.crc32(topic.encode())):
        _varint(value, out)
    _varint(max(delivered_next - committed, 0), out)
    body = bytearray()
    runs = 0
    listed = 0
    previous = committed
    for start, end, n in _count_runs(counts, committed):
        if len(out) + len(body) > _COUNTS_BUDGET or listed + end - start > MAX_COUNTED:
            break
        for value in (start - previous, end - start, n):
            _varint(value, body)
        previous, runs, listed = end, runs + 1, listed + end - start
    _varint(runs, out)
    out += body
    body.clear()
    runs = 0
    previous = committed + 1
    for start, end in finished.runs():
        if end <= previous:
            continue
        start = max(start, previous)
        room = len(out) + len(body) + 2 * 10 + 10  # this run and the run count, at most
        if room > _RAW_BUDGET:
            break
        _varint(start - previous, body)
        _varint(end - start, body)
        previous, runs = end + 1, runs + 1
    _varint(runs, out)
    out += body
    out += zlib.crc32(out).to_bytes(4, "big")
    return PREFIX + base64.b64encode(out).decode("ascii")


class _Malformed(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def varint(self) -> int:
        value = shift = 0
        while True:
            if self._at >= len(self._data) or shift > 63:
                raise _Malformed("truncated or oversized number")
            byte = self._data[self._at]
            self._at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if value > _MAX_OFFSET:
            raise _Malformed("number out of range")
        return value

    def done(self) -> bool:
        return self._at == len(self._data)


def decode(metadata: str, topic: str, partition: int, committed: int) -> OffsetMap | str:
    """The map in ``metadata`` of the commit at ``committed``, or why it is ignored."""
    if not metadata.startswith(PREFIX):
        return "not an ackgate offset map (or another version of it)"
    if len(metadata) > MAX_METADATA:
        return f"longer than {MAX_METADATA} characters"
    try:
        raw = base64.b64decode(metadata[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return "not base64"
    if len(raw) < 5 or zlib.crc32(raw[:-4]) != int.from_bytes(raw[-4:], "big"):
        return "checksum mismatch"
    reader = _Reader(raw[:-4])
    try:
        if (reader.varint(), reader.varint()) != (partition, committed):
            return "written for another partition or committed offset"
        if reader.varint() != zlib.crc32(topic.encode()):
            return "written for another topic"
        delivered_next = committed + reader.varint()
        counts: dict[int, int] = {}
        previous = committed
        for _ in range(reader.varint()):
            start = previous + reader.varint()
            end = start + reader.varint()
            n = reader.varint()
            if end <= start or n < 1 or len(counts) + end - start > MAX_COUNTED:
                return "a count run is empty, zero or too long"
            counts.update(dict.fromkeys(range(start, end), n))
            previous = end
        finished = OffsetRuns()
        previous = committed + 1
        for _ in range(reader.varint()):
            start = previous + reader.varint()
            end = start + reader.varint()
            if end <= start or end > _MAX_OFFSET:
                return "a finished run is empty or out of range"
            finished.add_run(start, end)
            previous = end + 1  # runs never touch: the encoder merges adjacent ones
        if not reader.done():
            return "trailing bytes"
    except _Malformed as exc:
        return str(exc)
    return OffsetMap(finished, delivered_next, counts)
