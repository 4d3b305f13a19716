"""What each subscriber of a group acked, by event id: the seam that lets a producer
carry per-subscriber progress across the group's lives (docs/concepts.md#redelivery-memory).

A broker that advances one offset per partition (Kafka) cannot say "handler A is done
with offsets 100..180, handler B only with 100..120" in its commit alone. A producer
that has room for more (Kafka's commit metadata) records it with
:meth:`SubscriberProgress.acked_offsets`, and a producer that reads such a record back
hands it to the group with :meth:`SubscriberProgress.seed_acked` before it yields those
events: the group then counts each subscriber ``acked`` for the copies it acked in an
earlier life, and does not hand them to it. Nothing is asked of a producer that does
neither, and the group pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol


class SubscriberProgress(Protocol):
    """The group's answer to "who acked which event ids ``(*prefix, offset)``".

    Given to a producer through ``SharedStreamProducer._watch_subscriber_progress``
    when the group starts reading it. Every method is synchronous, cheap and called
    from the event loop's thread.
    """

    @property
    def roster(self) -> tuple[Hashable, ...] | None:
        """The group's roster (docs/concepts.md#snapshot-and-roster), ``None`` for a
        dynamic group: there, progress is neither reported nor seeded, since a
        subscriber id may name another handler in the next life."""
        ...

    def acked_offsets(
        self, prefix: tuple[Hashable, ...], first: int
    ) -> dict[Hashable, list[tuple[int, int]]]:
        """Per roster member, the sorted, disjoint, non-adjacent runs ``[start, stop)``
        of offsets ``>= first`` whose events ``(*prefix, offset)`` it acked (window
        closed, every output confirmed), as far as the group remembers (its
        redelivery memory; forgotten acks are simply missing). Rejects and failures
        are never in it. Members without any are left out. Call it with a ``first``
        that only grows (a committed offset): lower ids are dropped from the answer
        for good once asked past."""
        ...

    def seed_acked(
        self, prefix: tuple[Hashable, ...], acked: Mapping[Hashable, Sequence[tuple[int, int]]]
    ) -> None:
        """Remember that each roster member in ``acked`` acked the events of the runs
        ``[start, stop)`` of offsets given for it, in an earlier life: when such an
        event is broadcast, the member is counted ``acked`` for it at once and not
        handed it (as for a copy redelivered within one life). Call it before those
        events are yielded. Ids of members not in the roster are ignored. Trust only
        what the broker recorded for this very partition and group: a wrong entry
        makes a handler miss a message."""
        ...

    def progress_overflowed(self) -> None:
        """Count one record of progress that did not fit the broker's limit
        (``GroupStats.progress_overflows``): some acks were left out, so those
        events are redelivered to those members after a restart (duplicates, never a
        loss)."""
        ...
