"""Point-in-time statistics of a live group."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class GroupStats:
    """A snapshot of one live group, as returned by ``SharedStreamManager.stats()``.

    Cheap enough to poll every second.

    Attributes:
        key: The group's key.
        mode: ``"ack"`` (subscribed with ``producer=``) or ``"fast"`` (``source=``).
        subscribers: Live subscriptions that are not force-failed.
        outstanding: Events broadcast and not yet advanced (ack mode; 0 on the fast
            path). Never more than the manager's ``max_outstanding``.
        lanes: Lanes with outstanding events.
        oldest_outstanding_age: Seconds since the oldest outstanding event was
            broadcast; ``0.0`` when none. A value that keeps growing means an event
            no one resolves: it is held until the ack timeout.
        advanced_events: Events handed to ``advance`` so far, in total.
        advance_calls: ``advance`` calls so far (events per call is the batching).
        failed_subscribers: Live subscriptions that were force-failed (ack timeout,
            overflow) and have not left yet.
        paused: Rostered groups: broadcasting nothing new because a member is not
            healthy (not attached, or force-failed). Always ``False`` for dynamic
            groups.
        missing: Rostered groups: the roster members not attached or force-failed,
            in roster order; ``()`` for dynamic groups.
        redeliveries_skipped: Deliveries saved (docs/concepts.md#redelivery-memory):
            redelivered copies counted acked at once for subscribers that had acked an
            earlier copy, instead of handed to them again.
        progress_overflows: Records of per-subscriber progress (a Kafka commit's offset
            map) that did not fit the producer's limit: the acks left out are
            redelivered to those subscribers after a restart or rebalance
            (duplicates, never a loss). Counted by producers that record progress.
        upstream_connected: ``False`` while the producer reports its broker
            unreachable (``SharedStreamProducer.upstream_lost``) and has not
            reported it back yet. Nothing is advanced meanwhile. Always ``True``
            for a producer that never reports (and on the fast path).
        upstream_down_since: Wall-clock time (``time.time()``, seconds since the
            epoch) the current outage was first reported; ``None`` while connected.
            It survives a restart of the group in the middle of the outage.
    """

    key: Hashable
    mode: Literal["ack", "fast"]
    subscribers: int
    outstanding: int
    lanes: int
    oldest_outstanding_age: float
    advanced_events: int
    advance_calls: int
    failed_subscribers: int
    paused: bool = False
    missing: tuple[Hashable, ...] = ()
    redeliveries_skipped: int = 0
    progress_overflows: int = 0
    upstream_connected: bool = True
    upstream_down_since: float | None = None
