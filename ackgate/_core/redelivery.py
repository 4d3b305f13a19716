"""Redelivery memory (docs/concepts.md#redelivery-memory): who already acked which event ids.

A broker redelivers an event when it was not advanced clean: a Kafka partition
held at an earlier offset refetches everything after it, an SQS/Pub/Sub/Service
Bus message whose handling failed for one subscriber comes back whole. The
subscribers that acked the earlier copy (window closed, every output confirmed)
are done with it; handing them the copy again only makes them redo the work.

What is remembered, per group and for the group's life, for the most recent ids
broadcast: the set of subscribers that acked them (any copy), as a bit mask over
subscriber ids, and whether a copy was broadcast before (only a copy of an id seen
before is checked at hand-out). Two forms, chosen by the ids a run comes with:

* **spans**, for runs whose ids count up by one (:class:`~ackgate.IdRange`, Kafka
  offsets): one record per run, ``[first, stop)`` with one mask; a subscriber that
  acked every event of the run sets its bit once (one that rejected or failed some
  records the ones it acked, as bits of an int). About 150 bytes per run: under 1
  byte per id for Kafka's fetches. A subscriber still busy with a run is asked
  directly (``Subscription._acked_in_open_part``).
* **cells**, for any other ids, and for the copies of ids of a span: one
  ``[mask, copies]`` cell per id. Copies are broadcast one by one
  (:meth:`RedeliveryMemory.run_length`).

With cells, a subscriber's bit is set on each id it acked, as it acks it; with a
span, once its part in the run is done.

One event may come in both forms: a broker's fetch with a gap (Kafka's offset map
leaves finished offsets out, a compacted topic has holes) gives ``(*prefix, offset)``
tuples, and a later refetch of the same offsets an :class:`~ackgate.IdRange`. Each
form looks the other up: a tuple in the spans (``_in_spans``), a range in the cells
of its prefix for as long as some are remembered (``_ranged_cells``).

Capacity: the most recent ``capacity`` ids in each form; oldest are forgotten
first, and forgetting only costs a duplicate delivery. Subscriber ids get a bit
each the first time they join, for the group's life (a bit is never reused, so a
remembered ack can never be credited to another subscriber); ids beyond the first
``_MAX_SUBSCRIBER_IDS`` of a group get none and are always handed every copy.
``benchmarks/redelivery_memory.py`` measures the bytes per id.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from operator import attrgetter

from ackgate._contract.outcome import IdRange

_MAX_SUBSCRIBER_IDS = 1024

_first = attrgetter("first")


def _split(event_id: Hashable) -> tuple[tuple[Hashable, ...], int] | None:
    """``(prefix, offset)`` if ``event_id`` is a tuple ``(*prefix, offset)`` with an
    int last item: an id that may also come as one of an :class:`IdRange`."""
    if type(event_id) is not tuple or len(event_id) < 2:
        return None
    offset = event_id[-1]
    if type(offset) is not int:
        return None
    return event_id[:-1], offset


class Remembered:
    """What a run knows of its ids: whether any was broadcast before, who acked
    every one of them (perhaps through an earlier copy), and how to remember an ack."""

    __slots__ = ("redelivered",)

    redelivered: bool
    #: For a copy of one id of a range, ``(prefix, offset)``: a subscriber still
    #: busy with the run that holds the earlier copy may have acked it already
    #: (``Subscription._acked_in_open_part``). ``None`` otherwise.
    in_range: tuple[tuple[Hashable, ...], int] | None = None

    def acked_by(self, flag: int) -> bool:
        """Whether the subscriber with bit ``flag`` acked a copy of every id."""
        raise NotImplementedError

    def ack(self, flag: int) -> None:
        """The subscriber with bit ``flag`` acked the run: every one of its ids."""
        raise NotImplementedError

    def ack_some(self, indexes: Iterable[int], flag: int) -> None:
        """The subscriber with bit ``flag`` acked the events at ``indexes`` of the run
        before the rest of it. Remembered per id where ids are cells; a span
        remembers a subscriber's acks once its part in the run is done."""

    def ack_except(self, marked: int, flag: int) -> None:
        """The subscriber with bit ``flag`` is done with the run: it acked every event
        but those whose bits are set in ``marked``."""


class _OneCell(Remembered):
    """A run of one event with an id: its cell, ``[mask, copies]``."""

    __slots__ = ("cell",)

    def __init__(self, cell: list[int]) -> None:
        self.cell = cell
        self.redelivered = cell[1] > 1

    def acked_by(self, flag: int) -> bool:
        return bool(self.cell[0] & flag)

    def ack(self, flag: int) -> None:
        self.cell[0] |= flag


class _CopyInRange(_OneCell):
    """A copy of one id of a range (a Kafka offset fetched again): its own cell for
    the acks of its copies, and the spans for the acks of the runs it was part of."""

    __slots__ = ("memory", "offset", "prefix")

    def __init__(
        self, cell: list[int], memory: RedeliveryMemory, prefix: tuple[Hashable, ...], offset: int
    ) -> None:
        super().__init__(cell)
        self.redelivered = True
        self.memory = memory
        self.prefix = prefix
        self.offset = offset

    @property
    def in_range(self) -> tuple[tuple[Hashable, ...], int]:  # type: ignore[override]
        return self.prefix, self.offset

    def acked_by(self, flag: int) -> bool:
        if self.cell[0] & flag:
            return True
        return self.memory.covered(self.prefix, self.offset, self.offset + 1, flag)


class _Cells(Remembered):
    """A run of several events whose ids are not a range: one cell per id."""

    __slots__ = ("cells",)

    def __init__(self, cells: list[list[int]]) -> None:
        self.cells = cells
        self.redelivered = any(cell[1] > 1 for cell in cells)

    def acked_by(self, flag: int) -> bool:
        return all(cell[0] & flag for cell in self.cells)

    def ack(self, flag: int) -> None:
        for cell in self.cells:
            cell[0] |= flag

    def ack_some(self, indexes: Iterable[int], flag: int) -> None:
        cells = self.cells
        for index in indexes:
            cells[index][0] |= flag

    def ack_except(self, marked: int, flag: int) -> None:
        for index, cell in enumerate(self.cells):
            if not marked >> index & 1:
                cell[0] |= flag


class _Span:
    """Ids ``(*prefix, first) .. (*prefix, stop - 1)`` and who acked all of them
    (``mask``) or some of them (``partial``: per subscriber flag, the bits of the ids
    it acked, when it rejected or failed others)."""

    __slots__ = ("first", "mask", "partial", "prefix", "stop")

    def __init__(self, prefix: tuple[Hashable, ...], first: int, stop: int) -> None:
        self.prefix = prefix
        self.first = first
        self.stop = stop
        self.mask = 0
        self.partial: dict[int, int] | None = None


class _Spanned(Remembered):
    """A run whose ids are a range: its span, and the memory to look copies up in."""

    __slots__ = ("memory", "span")

    def __init__(self, memory: RedeliveryMemory, span: _Span, redelivered: bool) -> None:
        self.memory = memory
        self.span = span
        self.redelivered = redelivered

    def acked_by(self, flag: int) -> bool:
        span = self.span
        if span.mask & flag:
            return True
        return self.memory.covered(span.prefix, span.first, span.stop, flag)

    def ack(self, flag: int) -> None:
        self.span.mask |= flag

    def ack_except(self, marked: int, flag: int) -> None:
        span = self.span
        if span.partial is None:
            span.partial = {}
        span.partial[flag] = span.partial.get(flag, 0) | (
            ((1 << (span.stop - span.first)) - 1) & ~marked
        )


class RedeliveryMemory:
    """Acked subscriber bits for the most recent ``capacity`` ids of each form."""

    __slots__ = (
        "_appended",
        "_bits",
        "_capacity",
        "_cell_index",
        "_cell_prefixes",
        "_cells",
        "_ids",
        "_longest",
        "_order",
        "_span_ids",
        "_spans",
        "_spans_order",
    )

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        #: Invariant: the keys of ``_cells`` are exactly the items of ``_order``,
        #: oldest first (at most ``capacity`` of them after each call).
        self._cells: dict[Hashable, list[int]] = {}
        self._order: deque[Hashable] = deque()
        #: Ids ever added to ``_cells``: the first ``_appended - len(_order)`` of them
        #: are forgotten.
        self._appended = 0
        #: Per prefix, ``_appended`` after the last cells with ids ``(*prefix,
        #: offset)`` were added: some are remembered while it exceeds the forgotten.
        self._cell_prefixes: dict[tuple[Hashable, ...], int] = {}
        #: Spans by prefix, each list sorted by ``first``. Invariant: the spans in
        #: these lists are exactly those of ``_spans_order`` (oldest first), and
        #: ``_span_ids`` is the sum of their lengths (at most ``capacity`` after
        #: each call, but for the newest span).
        self._spans: dict[tuple[Hashable, ...], list[_Span]] = {}
        self._spans_order: deque[_Span] = deque()
        self._span_ids = 0
        #: The longest span ever remembered: spans starting before ``first -
        #: _longest`` cannot reach ``first``.
        self._longest = 0
        self._bits: dict[Hashable, int] = {}
        #: The subscriber id of each bit (``_ids[bit]``).
        self._ids: list[Hashable] = []
        #: Per prefix, the cells of ids ``(*prefix, offset)`` by offset: kept only once
        #: a producer asks what was acked (``ranged_cells``), so nothing is paid otherwise.
        #: Invariant: every cell in it is a cell of ``_cells`` (forgotten together).
        self._cell_index: dict[tuple[Hashable, ...], dict[int, list[int]]] | None = None

    def __len__(self) -> int:
        """Ids remembered, in both forms."""
        return len(self._cells) + self._span_ids

    def bit(self, subscriber_id: Hashable) -> int | None:
        """The bit of ``subscriber_id`` (``None``: past the limit, never remembered)."""
        bit = self._bits.get(subscriber_id)
        if bit is None and len(self._bits) < _MAX_SUBSCRIBER_IDS:
            bit = self._bits[subscriber_id] = len(self._bits)
            self._ids.append(subscriber_id)
        return bit

    def subscriber_of(self, bit: int) -> Hashable:
        """The subscriber id that has ``bit``."""
        return self._ids[bit]

    def remember(self, event_ids: Sequence[Hashable]) -> Remembered:
        """The record of a run with ``event_ids`` (one per event), made now: each id
        counts one more copy broadcast."""
        if type(event_ids) is IdRange:
            prefix, first = event_ids.prefix, event_ids.first
            if event_ids.length == 1 and (
                self._overlaps(prefix, first, first + 1) or self._in_cells(prefix, first)
            ):
                # A copy: remembered alone (``run_length`` broadcasts copies one by one).
                [cell] = self.cells(event_ids)
                return _CopyInRange(cell, self, prefix, first)
            return self._spanned(event_ids)
        cells = self.cells(event_ids)
        where = self._note_ranged(event_ids[0])
        if len(cells) == 1:
            if where is not None and self._overlaps(where[0], where[1], where[1] + 1):
                # A copy, given without its range (a fetch with a gap).
                return _CopyInRange(cells[0], self, *where)
            return _OneCell(cells[0])
        self._note_ranged(event_ids[-1])
        return _Cells(cells)

    def _note_ranged(self, event_id: Hashable) -> tuple[tuple[Hashable, ...], int] | None:
        """If ``event_id`` is ``(*prefix, offset)``, a range of ``prefix`` looks up
        its cells from now on (while they are remembered); returns ``(prefix,
        offset)``."""
        where = _split(event_id)
        if where is not None:
            self._cell_prefixes[where[0]] = self._appended
        return where

    def _ranged_cells(self, prefix: tuple[Hashable, ...]) -> bool:
        """Whether cells with ids ``(*prefix, offset)`` may still be remembered."""
        stamp = self._cell_prefixes.get(prefix)
        if stamp is None:
            return False
        if stamp <= self._appended - len(self._order):
            del self._cell_prefixes[prefix]  # every one of them was forgotten since
            return False
        return True

    def _in_cells(self, prefix: tuple[Hashable, ...], offset: int) -> bool:
        """Whether ``(*prefix, offset)`` is remembered as a cell."""
        return self._ranged_cells(prefix) and (*prefix, offset) in self._cells

    def run_length(self, event_ids: Sequence[Hashable], start: int, limit: int) -> int:
        """How many of ``event_ids[start:start + limit]`` (``limit >= 1``) may form one
        run: the events of a run must be alike for every subscriber at hand-out (a
        subscriber is handed all of a run or none of it). Ids never seen before are
        alike; an id seen before is a run alone, or, for an :class:`IdRange`, the
        stretch up to the next edge of a remembered span."""
        if type(event_ids) is IdRange:
            # Copies go one by one: each subscriber may have acked some of a run's
            # events and not others. New ids go together, up to the first copy.
            prefix = event_ids.prefix
            first = event_ids.first + start
            if self._overlaps(prefix, first, first + 1):
                return 1
            same_prefix = self._spans.get(prefix)
            if same_prefix:
                at = bisect_left(same_prefix, first, key=_first)
                if at < len(same_prefix):
                    limit = min(limit, same_prefix[at].first - first)
            if self._ranged_cells(prefix):
                cells = self._cells
                for offset in range(limit):
                    if (*prefix, first + offset) in cells:
                        return max(offset, 1)
            return limit
        cells = self._cells
        spans = self._spans
        event_id = event_ids[start]
        if event_id in cells or (spans and self._in_spans(event_id) is not None):
            return 1
        fresh = {event_id}
        for offset in range(1, limit):
            event_id = event_ids[start + offset]
            if event_id in cells or event_id in fresh:
                return offset
            if spans and self._in_spans(event_id) is not None:
                return offset
            fresh.add(event_id)
        return limit

    def _in_spans(self, event_id: Hashable) -> tuple[tuple[Hashable, ...], int] | None:
        """``(prefix, offset)`` if ``event_id`` is ``(*prefix, offset)`` and a span
        holds it: the same event as one of a range, given without a range."""
        where = _split(event_id)
        if where is not None and self._overlaps(where[0], where[1], where[1] + 1):
            return where
        return None

    def cells(self, event_ids: Sequence[Hashable]) -> list[list[int]]:
        """The cell of each of ``event_ids``, made (and remembered) for new ids;
        each id counts one more copy broadcast. Forgets the oldest ids beyond
        ``capacity``; a run keeps its cells meanwhile, and acks on a forgotten cell
        are simply not remembered (a duplicate later, at worst)."""
        cells = self._cells
        order = self._order
        before = len(order)
        found: list[list[int]] = []
        for event_id in event_ids:
            fresh = [0, 1]
            cell = cells.setdefault(event_id, fresh)  # one hash of the id, not two
            if cell is fresh:
                order.append(event_id)
            else:
                cell[1] += 1
            found.append(cell)
        self._appended += len(order) - before
        index = self._cell_index
        if index is not None and len(order) > before:
            for position in range(before, len(order)):
                self._index_cell(index, order[position])
        for _ in range(len(order) - self._capacity):
            forgotten = order.popleft()
            del cells[forgotten]
            if index is not None:
                where = _split(forgotten)
                if where is not None:
                    index.get(where[0], {}).pop(where[1], None)
        return found

    def _index_cell(
        self, index: dict[tuple[Hashable, ...], dict[int, list[int]]], event_id: Hashable
    ) -> None:
        where = _split(event_id)
        if where is not None:
            index.setdefault(where[0], {})[where[1]] = self._cells[event_id]

    def ranged_cells(self, prefix: tuple[Hashable, ...], first: int) -> list[tuple[int, int]]:
        """``(offset, mask)`` of the cells of ids ``(*prefix, offset)``, ``offset >=
        first``, in no order. Cells below ``first`` are no longer looked at by this
        method (a caller asks with a ``first`` that only grows; asking lower later
        misses them, which costs duplicates only). Caller: a producer recording
        progress (:mod:`ackgate._core.progress`)."""
        index = self._cell_index
        if index is None:
            index = self._cell_index = {}
            for event_id in self._order:
                self._index_cell(index, event_id)
        cells = index.get(prefix)
        if not cells:
            return []
        below = [offset for offset in cells if offset < first]
        for offset in below:
            del cells[offset]
        return [(offset, cell[0]) for offset, cell in cells.items() if cell[0]]

    def spans_reaching(self, prefix: tuple[Hashable, ...], first: int) -> list[_Span]:
        """The remembered spans of ``prefix`` holding an id ``first`` or later."""
        spans = self._spans.get(prefix)
        if not spans:
            return []
        start = bisect_left(spans, first - self._longest, key=_first)
        return [span for span in spans[start:] if span.stop > first]

    def seed(self, prefix: tuple[Hashable, ...], first: int, stop: int, mask: int) -> None:
        """Remember that the subscribers whose flags are set in ``mask`` acked the ids
        ``(*prefix, first) .. (*prefix, stop - 1)`` before (in an earlier life of the
        group, as the producer's broker recorded it): a copy broadcast later is not
        handed to them. Forgotten like any span."""
        assert first < stop and mask, (first, stop, mask)
        self._add_span(self._spans.setdefault(prefix, []), prefix, first, stop).mask = mask

    def _spanned(self, ids: IdRange) -> _Spanned:
        prefix, first = ids.prefix, ids.first
        stop = first + ids.length
        spans = self._spans.get(prefix)
        if spans is None:
            spans = self._spans[prefix] = []
        at = bisect_left(spans, first - self._longest, key=_first)
        redelivered = False
        for index in range(at, len(spans)):
            span = spans[index]
            if span.first >= stop:
                break
            if span.stop > first:
                redelivered = True
                if span.first == first and span.stop == stop:
                    return _Spanned(self, span, True)  # the same run fetched again
        return _Spanned(self, self._add_span(spans, prefix, first, stop), redelivered)

    def _add_span(
        self, spans: list[_Span], prefix: tuple[Hashable, ...], first: int, stop: int
    ) -> _Span:
        """A new span in ``spans`` (those of ``prefix``); the oldest are forgotten
        beyond ``capacity`` ids."""
        span = _Span(prefix, first, stop)
        spans.insert(bisect_right(spans, first, key=_first), span)
        self._longest = max(self._longest, stop - first)
        self._spans_order.append(span)
        self._span_ids += stop - first
        while self._span_ids > self._capacity and len(self._spans_order) > 1:
            self._forget(self._spans_order.popleft())
        return span

    def _forget(self, span: _Span) -> None:
        spans = self._spans[span.prefix]
        at = bisect_left(spans, span.first, key=_first)
        while spans[at] is not span:
            at += 1
        del spans[at]
        if not spans:
            del self._spans[span.prefix]
        self._span_ids -= span.stop - span.first

    def _overlaps(self, prefix: tuple[Hashable, ...], first: int, stop: int) -> bool:
        """Whether a remembered span holds one of the ids ``first .. stop - 1``."""
        spans = self._spans.get(prefix)
        if not spans:
            return False
        for index in range(bisect_left(spans, first - self._longest, key=_first), len(spans)):
            span = spans[index]
            if span.first >= stop:
                return False
            if span.stop > first:
                return True
        return False

    def covered(self, prefix: tuple[Hashable, ...], first: int, stop: int, flag: int) -> bool:
        """Whether the spans carrying ``flag`` cover every id ``first .. stop - 1``."""
        spans = self._spans.get(prefix)
        if not spans:
            return False
        reach = first
        for index in range(bisect_left(spans, first - self._longest, key=_first), len(spans)):
            span = spans[index]
            if span.first > reach:
                return False  # sorted by ``first``: nothing later starts early enough
            if span.mask & flag and span.stop > reach:
                reach = span.stop
                if reach >= stop:
                    return True
            elif (
                stop - first == 1
                and span.partial is not None
                and span.stop > first
                and span.partial.get(flag, 0) >> (first - span.first) & 1
            ):
                return True  # one id, acked in a run where others were not
        return False
