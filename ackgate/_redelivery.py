"""Redelivery memory (SPEC §13): who already acked which event id.

A broker redelivers an event when it was not advanced clean: a Kafka partition
held at an earlier offset refetches everything after it, an SQS/Pub/Sub/Service
Bus message whose handling failed for one subscriber comes back whole. The
subscribers that acked the earlier copy (window closed, every output confirmed)
are done with it; handing them the copy again only makes them redo the work.

What is remembered, per group and for the group's life: for each of the last
``capacity`` distinct event ids that at least one subscriber acked, the set of
subscribers that acked it, as a bit mask over subscriber ids. Oldest ids are
forgotten first; forgetting one only costs a duplicate delivery. Subscriber ids
get a bit each the first time they join, for the group's life (a bit is never
reused, so a remembered ack can never be credited to another subscriber); ids
beyond the first ``_MAX_SUBSCRIBER_IDS`` of a group (dynamic groups with ever-new
ids) get none and are always handed every copy. Rejections and failures are never
remembered: a subscriber that did not ack is handed the copy.

Size: one dict entry and one deque slot per remembered id, plus the id itself
(``benchmarks/redelivery_memory.py`` measures the bytes per id).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

_MAX_SUBSCRIBER_IDS = 1024


class RedeliveryMemory:
    """Acked subscriber bits per event id, for the ``capacity`` most recent ids."""

    __slots__ = ("_acked_by", "_bits", "_capacity", "_order")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        #: Invariant: the keys of ``_acked_by`` are exactly the items of ``_order``.
        self._acked_by: dict[Hashable, int] = {}
        self._order: deque[Hashable] = deque()
        self._bits: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._acked_by)

    def bit(self, subscriber_id: Hashable) -> int | None:
        """The bit of ``subscriber_id`` (``None``: past the limit, never remembered)."""
        bit = self._bits.get(subscriber_id)
        if bit is None and len(self._bits) < _MAX_SUBSCRIBER_IDS:
            bit = self._bits[subscriber_id] = len(self._bits)
        return bit

    @property
    def acked_by(self) -> dict[Hashable, int]:
        """The acked bits by event id, for lookups in bulk (read it, never write it)."""
        return self._acked_by

    def acked_mask(self, event_id: Hashable) -> int:
        return self._acked_by.get(event_id, 0)

    def remember(self, event_id: Hashable, bit: int) -> None:
        acked_by = self._acked_by
        mask = acked_by.get(event_id)
        if mask is not None:
            acked_by[event_id] = mask | (1 << bit)
            return
        acked_by[event_id] = 1 << bit
        order = self._order
        order.append(event_id)
        if len(order) > self._capacity:
            del acked_by[order.popleft()]

    def remember_all(self, event_ids: list[Hashable], bit: int) -> None:
        """:meth:`remember` for each of ``event_ids``: one subscriber acked them all."""
        acked_by = self._acked_by
        flag = 1 << bit
        fresh: list[Hashable] = []
        for event_id in event_ids:
            mask = acked_by.get(event_id)
            if mask is None:
                acked_by[event_id] = flag
                fresh.append(event_id)
            else:
                acked_by[event_id] = mask | flag
        if fresh:
            order = self._order
            order.extend(fresh)
            for _ in range(len(order) - self._capacity):
                del acked_by[order.popleft()]
