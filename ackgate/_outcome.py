"""What a producer is told about each event it must advance."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class AdvanceOutcome:
    """How the subscribers in an event's snapshot resolved it.

    Every subscriber in the snapshot is counted in exactly one field, so
    ``acked + failed + rejected`` is the snapshot size. ``reasons`` holds one
    ``"<subscriber_id>: <reason>"`` per rejecting subscriber that gave a reason,
    in subscription order (the order in which the group's subscriptions were
    created by ``subscribe``; one that leaves and subscribes again counts from its
    new ``subscribe``). Write them into the dead-letter record.
    """

    acked: int
    failed: int
    rejected: int
    reasons: tuple[str, ...] = ()

    @property
    def is_clean(self) -> bool:
        """True only if at least one subscriber acked and nobody failed or rejected.

        An event broadcast to nobody is not clean: no one accepted it, so there is
        no ground to commit it.
        """
        return self.failed == 0 and self.rejected == 0 and self.acked >= 1


class AdvanceItem(NamedTuple):
    """One event of an :meth:`SharedStreamProducer.advance` batch."""

    broker_payload: Any
    outcome: AdvanceOutcome


class EventBatch(NamedTuple):
    """Events fetched together, as :meth:`SharedStreamProducer.open_stream_batches`
    yields them: the bulk form of ``open_stream``'s pairs.

    ``raw_events[i]`` and ``broker_payloads[i]`` are one event (equal lengths, at
    least one event). Every event of a batch is in the same ``lane`` (what
    :meth:`~SharedStreamProducer.get_advance_lane` would return for each of
    them), and ``event_ids`` is ``None`` or holds what
    :meth:`~SharedStreamProducer.get_event_id` would return for each.
    """

    raw_events: Sequence[Any]
    broker_payloads: Sequence[Any]
    lane: Hashable = None
    event_ids: Sequence[Hashable] | None = None
