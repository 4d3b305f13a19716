"""The fan-out log: one shared append-only log per group, one cursor per subscriber.

Fan-out is O(1) per event whatever the number of subscribers: the poll appends an
event once, and each subscriber reads it by moving its own cursor (as in the LMAX
Disruptor). A subscriber's unread count is ``log.head - cursor``. An entry leaves
the log once every subscriber in its snapshot has either been handed it or stopped
owing it, which keeps memory proportional to the slowest reader's lag.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackgate._tracker import Lane


class Event:
    """One raw event of a group, shared by every subscriber in its snapshot.

    Invariants (checked by ``tests/core/test_stateful.py``):
    ``acked + failed + rejected + pending == snapshot`` at all times (``acked`` is
    derived, so a subscriber's ack costs one decrement), and
    ``undelivered <= pending + popcount(skipped)``: nobody is handed an event it no
    longer owes (subscribers in ``skipped`` pass it without being handed it), and
    ``skipped`` is nonzero only if ``redelivered``.
    """

    __slots__ = (
        "acked_cell",
        "broadcast_at",
        "failed",
        "lane",
        "payload",
        "pending",
        "position",
        "raw",
        "redelivered",
        "rejected",
        "skipped",
        "snapshot",
        "undelivered",
    )

    def lane_key(self) -> Hashable:
        return None if self.lane is None else self.lane.key

    def __init__(
        self,
        position: int,
        raw: Any,
        payload: Any,
        lane: Lane | None,
        snapshot: int,
        broadcast_at: float,
        acked_cell: list[int] | None = None,
    ) -> None:
        self.position = position
        self.raw = raw
        self.payload = payload
        self.lane = lane
        self.snapshot = snapshot
        #: Subscribers in the snapshot that have not resolved the event yet.
        self.pending = snapshot
        #: Subscribers in the snapshot that have not been handed the event yet.
        self.undelivered = snapshot
        self.broadcast_at = broadcast_at
        #: The redelivery memory's cell of the event's id (SPEC §13): the bits of the
        #: subscribers that acked a copy of it. ``None`` when the event has no id.
        self.acked_cell = acked_cell
        #: Whether a copy of the event's id was broadcast before in this group: only
        #: then may a subscriber have acked an earlier copy, and a hand-out check it.
        self.redelivered = acked_cell is not None and acked_cell[1] > 1
        #: Bits of the subscribers counted acked because they acked an earlier copy of
        #: the event's id, before its broadcast or before its hand-out: they pass the
        #: event without being handed it.
        self.skipped = 0
        self.failed = 0
        self.rejected = 0

    @property
    def acked(self) -> int:
        """Subscribers in the snapshot that acked the event (or an earlier copy)."""
        return self.snapshot - self.pending - self.failed - self.rejected


class EventLog:
    """Events not yet handed to every subscriber that owes them, in broadcast order.

    ``head`` is the position the next appended event gets. Positions are the
    events' positions in the stream (0, 1, 2, ...), so a cursor is a position.
    """

    __slots__ = ("base", "entries", "head")

    def __init__(self) -> None:
        self.entries: deque[Event] = deque()
        #: Position of ``entries[0]``. Invariant: ``base + len(entries) == head``.
        self.base = 0
        self.head = 0

    def append(self, event: Event) -> None:
        assert event.position == self.head
        self.entries.append(event)
        self.head += 1
        if event.undelivered == 0:
            self.trim()

    def at(self, position: int) -> Event:
        return self.entries[position - self.base]

    def trim(self) -> None:
        """Drop leading entries that nobody will be handed any more."""
        entries = self.entries
        while entries and entries[0].undelivered == 0:
            entries.popleft()
            self.base += 1
