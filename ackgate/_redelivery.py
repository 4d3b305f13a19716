"""Redelivery memory (SPEC §13): who already acked which event id.

A broker redelivers an event when it was not advanced clean: a Kafka partition
held at an earlier offset refetches everything after it, an SQS/Pub/Sub/Service
Bus message whose handling failed for one subscriber comes back whole. The
subscribers that acked the earlier copy (window closed, every output confirmed)
are done with it; handing them the copy again only makes them redo the work.

What is remembered, per group and for the group's life: for each of the last
``capacity`` distinct event ids broadcast, the set of subscribers that acked it
(any copy of it), as a bit mask over subscriber ids, and how many copies of it
were broadcast (only a copy of an id seen before is checked at hand-out). Oldest
ids are forgotten first; forgetting one only costs a duplicate delivery.
Subscriber ids get a bit each the first time they join, for the group's life (a
bit is never reused, so a remembered ack can never be credited to another
subscriber); ids beyond the first ``_MAX_SUBSCRIBER_IDS`` of a group (dynamic
groups with ever-new ids) get none and are always handed every copy. Rejections
and failures are never remembered: a subscriber that did not ack is handed the copy.

Size: one dict entry, one deque slot and one two-item list per remembered id, plus
the id itself (``benchmarks/redelivery_memory.py`` measures the bytes per id).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

_MAX_SUBSCRIBER_IDS = 1024


class RedeliveryMemory:
    """Acked subscriber bits per event id, for the ``capacity`` most recent ids.

    Each id has a *cell*, a two-item list ``[mask, copies]``: the bits of the
    subscribers that acked a copy of it, and how many copies of it were broadcast,
    made when an event with that id is first broadcast. The event keeps a reference
    to its cell, so a subscriber's ack costs one ``|=`` on it, not a lookup by id; a
    later copy of the id is handed the same cell, so an ack of any copy counts for
    all of them.
    """

    __slots__ = ("_bits", "_capacity", "_cells", "_order")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        #: Invariant: the keys of ``_cells`` are exactly the items of ``_order``,
        #: oldest first (at most ``capacity`` of them after each call).
        self._cells: dict[Hashable, list[int]] = {}
        self._order: deque[Hashable] = deque()
        self._bits: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._cells)

    def bit(self, subscriber_id: Hashable) -> int | None:
        """The bit of ``subscriber_id`` (``None``: past the limit, never remembered)."""
        bit = self._bits.get(subscriber_id)
        if bit is None and len(self._bits) < _MAX_SUBSCRIBER_IDS:
            bit = self._bits[subscriber_id] = len(self._bits)
        return bit

    def cells(self, event_ids: Sequence[Hashable]) -> list[list[int]]:
        """The cell of each of ``event_ids``, made (and remembered) for new ids;
        each id counts one more copy broadcast.

        A cell's mask is what the subscribers acked of earlier copies so far, and
        ``copies > 1`` once the event is a redelivered copy (SPEC §13). Forgets the
        oldest ids beyond ``capacity``; an event keeps its cell meanwhile, and acks
        on a forgotten cell are simply not remembered (a duplicate later, at worst).
        """
        cells = self._cells
        order = self._order
        found: list[list[int]] = []
        for event_id in event_ids:
            fresh = [0, 1]
            cell = cells.setdefault(event_id, fresh)  # one hash of the id, not two
            if cell is fresh:
                order.append(event_id)
            else:
                cell[1] += 1
            found.append(cell)
        for _ in range(len(order) - self._capacity):
            del cells[order.popleft()]
        return found
