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
  restarts. A member that finished an offset is not handed it again, so the count
  of an unfinished offset is the count of each member that has not finished it.
* **per member**: for each roster member (a ``Service`` handler's id), the runs of
  offsets at or past ``C`` it acked, beyond the finished ones. The next owner hands
  the group these as the member's acks (``ackgate.SubscriberProgress.seed_acked``):
  the member is not handed them again, the others are.

Encoding: ``"ackgate2:"`` + base64 of unsigned LEB128 varints: partition, ``C``, the
CRC-32 of the topic, ``delivered_next - C``, the count runs ``(gap, length,
deliveries)``, the finished runs ``(gap, length)`` (each gap from the end of the
previous run; for finished runs, which never touch, from one past it, and the first
from ``C + 1``), the members (their number, then per member the length of its UTF-8
id, the id, its number of runs and its runs ``(gap, length)``, each gap from the end
of the previous run, the first from ``C``), then a CRC-32 of all of it. A map of the
first version (``"ackgate1:"``, no members) is still read.
At most ``max_chars`` characters (:data:`MAX_METADATA` by default; Kafka refuses
metadata over ``offset.metadata.max.bytes``, 4096 by default): the runs farthest from
``C`` are left out when they do not fit, which only costs duplicates, and
:func:`encode` says so.

:func:`decode` trusts a map only when it is one of these versions, for this topic,
partition and committed offset, intact (checksum) and bounded; anything else is
ignored, so the worst a bad map does is leave offsets to be delivered again. A
member's runs past ``C +`` :data:`MAX_MEMBER_SPAN` are not trusted either.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from bisect import bisect_right
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

PREFIX = "ackgate2:"
_FIRST_VERSION = "ackgate1:"
MAX_METADATA = 4000
# A map's members can not say more than this many offsets past the committed one: the
# group remembers about 65,536 ids, and a seed farther away would be forgotten anyway.
MAX_MEMBER_SPAN = 32_768
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
    #: Per member id, the sorted runs ``[start, end)`` of offsets it acked.
    members: Mapping[Hashable, list[tuple[int, int]]] = field(default_factory=dict)


def raw_budget(max_chars: int) -> int:
    """Raw bytes that fit in ``max_chars`` once base64-encoded, less the checksum."""
    return (max_chars - len(PREFIX)) // 4 * 3 - 4


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


def _without(
    runs: Iterable[tuple[int, int]], finished: OffsetRuns, low: int
) -> Iterator[tuple[int, int]]:
    """``runs`` (sorted, disjoint) from ``low`` on, less the offsets in ``finished``."""
    cuts = list(finished.runs())
    at = 0
    for start, end in runs:
        start = max(start, low)
        while at < len(cuts) and cuts[at][1] <= start:
            at += 1
        index = at
        while start < end:
            if index < len(cuts) and cuts[index][0] < end:
                cut_start, cut_end = cuts[index]
                if cut_start > start:
                    yield start, cut_start
                start = max(start, cut_end)
                index += 1
            else:
                yield start, end
                break


def encode(
    topic: str,
    partition: int,
    committed: int,
    finished: OffsetRuns,
    delivered_next: int,
    counts: Mapping[int, int],
    members: Mapping[str, Iterable[tuple[int, int]]] | None = None,
    max_chars: int = MAX_METADATA,
) -> tuple[str, bool]:
    """The metadata of a commit at ``committed`` (entries below it are left out), and
    whether all of it fit in ``max_chars``. ``members`` maps a member id to the sorted,
    disjoint runs ``[start, end)`` of offsets it acked."""
    budget = raw_budget(max_chars)
    complete = True
    out = bytearray()
    for value in (partition, committed, zlib.crc32(topic.encode())):
        _varint(value, out)
    _varint(max(delivered_next - committed, 0), out)
    body = bytearray()
    runs = 0
    listed = 0
    previous = committed
    # Count runs get at most a third of the room: the finished runs save more work.
    for start, end, n in _count_runs(counts, committed):
        if len(out) + len(body) > budget // 3 or listed + end - start > MAX_COUNTED:
            complete = False
            break
        for value in (start - previous, end - start, n):
            _varint(value, body)
        previous, runs, listed = end, runs + 1, listed + end - start
    _varint(runs, out)
    out += body
    body.clear()
    runs = 0
    previous = committed + 1
    # The finished runs may take all the room left, or half of it when members share it.
    finished_budget = budget if not members else len(out) + (budget - len(out)) // 2
    for start, end in finished.runs():
        if end <= previous:
            continue
        start = max(start, previous)
        room = len(out) + len(body) + 2 * 10 + 10  # this run and the run count, at most
        if room > finished_budget:
            complete = False
            break
        _varint(start - previous, body)
        _varint(end - start, body)
        previous, runs = end + 1, runs + 1
    _varint(runs, out)
    out += body
    listed_members = [
        (member.encode(), member_runs) for member, member_runs in (members or {}).items()
    ]
    _varint(len(listed_members), out)
    for index, (name, member_runs) in enumerate(listed_members):
        # Each member gets an equal share of what is left (what one leaves, the next gets).
        share = len(out) + (budget - len(out)) // (len(listed_members) - index)
        _varint(len(name), out)
        out += name
        body.clear()
        runs = 0
        previous = committed
        for start, end in _without(member_runs, finished, committed):
            if len(out) + len(body) + 2 * 10 + 10 > share:
                complete = False
                break
            _varint(start - previous, body)
            _varint(end - start, body)
            previous, runs = end, runs + 1
        _varint(runs, out)
        out += body
    if len(out) > budget:
        # Not even the member ids fit: the map without members.
        return encode(
            topic, partition, committed, finished, delivered_next, counts, None, max_chars
        )[0], False
    out += zlib.crc32(out).to_bytes(4, "big")
    return PREFIX + base64.b64encode(out).decode("ascii"), complete


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

    def take(self, length: int) -> bytes:
        if self._at + length > len(self._data):
            raise _Malformed("truncated")
        taken = self._data[self._at : self._at + length]
        self._at += length
        return taken

    def done(self) -> bool:
        return self._at == len(self._data)


def decode(
    metadata: str, topic: str, partition: int, committed: int, max_chars: int = MAX_METADATA
) -> OffsetMap | str:
    """The map in ``metadata`` of the commit at ``committed``, or why it is ignored."""
    if metadata.startswith(PREFIX):
        with_members = True
    elif metadata.startswith(_FIRST_VERSION):
        with_members = False
    else:
        return "not an ackgate offset map (or another version of it)"
    if len(metadata) > max(max_chars, MAX_METADATA):
        return f"longer than {max(max_chars, MAX_METADATA)} characters"
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
        members: dict[Hashable, list[tuple[int, int]]] = {}
        for _ in range(reader.varint() if with_members else 0):
            try:
                member = reader.take(reader.varint()).decode()
            except UnicodeDecodeError:
                return "a member id is not UTF-8"
            if member in members:
                return "a member is listed twice"
            member_runs: list[tuple[int, int]] = []
            previous = committed
            for _ in range(reader.varint()):
                start = previous + reader.varint()
                end = start + reader.varint()
                if end <= start or (member_runs and start <= member_runs[-1][1]):
                    return "a member's run is empty or touches the one before"
                # Not trusted past MAX_MEMBER_SPAN: left out, delivered again.
                if start < committed + MAX_MEMBER_SPAN:
                    member_runs.append((start, min(end, committed + MAX_MEMBER_SPAN)))
                previous = end
            members[member] = member_runs
        if not reader.done():
            return "trailing bytes"
    except _Malformed as exc:
        return str(exc)
    return OffsetMap(finished, delivered_next, counts, members)
