"""Delivery counts per event id, for producers whose broker keeps none.

SQS, Pub/Sub under a dead-letter policy and Service Bus count deliveries
themselves, and their adapters pass that count on as ``Message.attempt``. Where
the broker keeps no count (Pub/Sub without a dead-letter policy), the producer
counts the deliveries it sees with :class:`DeliveryCounts`:
for its own life only, so a count starts again at 1 when a new producer is made
(a restart of the service's group, a new process).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from ackgate._contract.checks import check_int


class DeliveryCounts:
    """How many times each event id was delivered, for the ``capacity`` most recent ids.

    A producer calls :meth:`add` once per delivery it yields and :meth:`get` in
    ``to_message`` for ``Message.attempt``. Ids are forgotten oldest first (by the
    time they were first delivered) once more than ``capacity`` are known; a
    forgotten id counts from 1 again, which only delays a ``give_up_after``. Each
    remembered id costs one dict entry and one deque slot besides the id itself.
    Not thread-safe: use it from the producer's event loop.
    """

    __slots__ = ("_capacity", "_counts", "_order")

    def __init__(self, capacity: int = 65_536) -> None:
        check_int("capacity", capacity, minimum=1)
        self._capacity = capacity
        #: Invariant: the keys of ``_counts`` are exactly the items of ``_order``,
        #: oldest first, at most ``capacity`` of them; every count is >= 1.
        self._counts: dict[Hashable, int] = {}
        self._order: deque[Hashable] = deque()

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, event_id: Hashable) -> int:
        """Count one more delivery of ``event_id``; return its deliveries so far (1 the
        first time)."""
        counts = self._counts
        count = counts.get(event_id, 0) + 1
        counts[event_id] = count
        if count == 1:
            order = self._order
            order.append(event_id)
            if len(order) > self._capacity:
                del counts[order.popleft()]
        return count

    def get(self, event_id: Hashable) -> int:
        """Deliveries of ``event_id`` counted so far; 0 if never counted (or forgotten)."""
        return self._counts.get(event_id, 0)
