"""The fan-out log: one shared append-only log of runs per group, one cursor per subscriber.

A *run* is a stretch of consecutive events of one lane broadcast together (a
producer's :class:`~ackgate.EventBatch`, or part of one; a single event from
``open_stream``). It travels through the group as one unit: one log entry, one
pending count, one tracker item in its lane, one advance. Per-event state exists
only where an event was treated differently from the rest of its run (a reject, a
failure), as a sparse mark.

Fan-out is O(1) per run whatever the number of subscribers: the poll appends a
run once, and each subscriber reads it by moving its own cursor (as in the LMAX
Disruptor). A subscriber's unread count is ``log.head - cursor`` (positions count
events). A run leaves the log once every subscriber in its snapshot has moved its
cursor past it or stopped owing it, which keeps memory proportional to the slowest
reader's lag.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any, Literal

from ackgate._core.redelivery import Remembered

#: How a subscriber resolves an event other than by acking it.
Resolution = Literal["failed", "rejected"]


class Run:
    """Consecutive events of one lane, shared by every subscriber in their snapshot.

    A subscriber's *part* in a run is every event of it. ``pending`` counts the
    subscribers in the snapshot whose part is not resolved yet; the run is advanced
    once it is 0 (and its lane's earlier runs were advanced).

    How each subscriber resolved each event: a subscriber that resolved its whole
    part one way without being handed any of it (it left or failed before, or a
    whole batch it held failed) counts once in ``failed`` / ``rejected``, and so
    does one that failed or rejected the event of a run of one; one that treated
    single events of a longer run differently counts per event in the run's
    *marks* (``LaneTracker.marks``: index -> ``[failed, rejected]``, kept aside:
    most runs never have any); every other member of the snapshot acked the event.

    Invariants (checked by ``tests/core/test_stateful.py``): for every index,
    ``failed + rejected + marks[i] <= snapshot`` and, once ``pending`` is 0,
    ``acked = snapshot - failed - rejected - sum(marks[i])`` for each event;
    ``undelivered`` counts the subscribers in the snapshot whose cursor has not
    passed the run yet (or who still might be handed part of it); ``skipped`` is
    ``None`` unless the run is a redelivered copy, and then holds the bits of the
    subscribers counted acked because they acked an earlier copy of every event of
    the run.
    """

    __slots__ = (
        "broadcast_at",
        "count",
        "failed",
        "lane",
        "memory",
        "payloads",
        "pending",
        "position",
        "raws",
        "rejected",
        "skipped",
        "snapshot",
        "undelivered",
    )

    def __init__(
        self,
        position: int,
        count: int,
        raws: Any,
        payloads: Any,
        lane: Lane | None,
        snapshot: int,
        broadcast_at: float,
        memory: Remembered | None = None,
    ) -> None:
        #: Stream position of the run's first event; its events are at
        #: ``position .. position + count - 1``.
        self.position = position
        self.count = count
        #: The raw events and broker payloads: sequences of ``count`` items, but for a
        #: run of one event, which holds its raw event and payload themselves (the
        #: per-event path: no sequence to build or keep per event). Read them through
        #: ``raw_events`` / ``broker_payloads`` off the hot paths.
        self.raws = raws
        self.payloads = payloads
        self.lane = lane
        self.snapshot = snapshot
        self.pending = snapshot
        self.undelivered = snapshot
        self.broadcast_at = broadcast_at
        #: The redelivery memory's record of the run's ids (docs/concepts.md#redelivery-memory), if
        #: it has ids.
        self.memory = memory
        #: ``None`` unless an earlier copy of one of its ids was broadcast in this
        #: group: only then may a subscriber have acked an earlier copy, and a
        #: hand-out check it (``is not None`` is that check, on the hot path).
        self.skipped: int | None = 0 if memory is not None and memory.redelivered else None
        self.failed = 0
        self.rejected = 0

    def raw_events(self, start: int, stop: int) -> list[Any]:
        """The raw events ``start .. stop - 1``, in a new list."""
        return [self.raws] if self.count == 1 else list(self.raws[start:stop])

    def broker_payloads(self) -> Sequence[Any]:
        return (self.payloads,) if self.count == 1 else self.payloads

    def lane_key(self) -> Hashable:
        return None if self.lane is None else self.lane.key


class Lane:
    """One lane's runs not advanced yet, in fan-out order (``ackgate._core.tracker``
    advances them from the front): the one in flight, and whether the lane is on
    the tracker's ready queue."""

    __slots__ = ("in_flight", "key", "queued", "runs")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.runs: deque[Run] = deque()
        self.in_flight: list[Run] | None = None
        self.queued = False


class EventLog:
    """Runs not yet passed by every subscriber that owes them, in broadcast order.

    ``head`` is the position the next broadcast event gets, ``next_seq`` the index
    the next run gets. ``entries[0]`` is the run with index ``base``. Invariant:
    ``base + len(entries) == next_seq``.
    """

    __slots__ = ("base", "entries", "head", "next_seq")

    def __init__(self) -> None:
        self.entries: deque[Run] = deque()
        self.base = 0
        self.head = 0
        self.next_seq = 0

    def append(self, run: Run) -> None:
        assert run.position == self.head
        self.entries.append(run)
        self.head += run.count
        self.next_seq += 1
        if run.undelivered == 0:
            self.trim()

    def at(self, seq: int) -> Run:
        return self.entries[seq - self.base]

    def trim(self) -> None:
        """Drop leading runs that nobody will be handed any part of any more."""
        entries = self.entries
        while entries and entries[0].undelivered == 0:
            entries.popleft()
            self.base += 1
