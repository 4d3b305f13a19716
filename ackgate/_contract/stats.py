"""Point-in-time statistics of a live group."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

_NO_LANES: Mapping[Hashable, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class BrokerLag:
    """What the broker holds that a group has not advanced past, as its producer last
    measured it (:meth:`SharedStreamProducer.broker_lag`). Fields a broker does not
    have are left at their defaults.

    Attributes:
        lanes: Per lane the broker numbers (a Kafka partition): its end offset minus
            the committed offset, i.e. the messages not advanced past yet, read or
            not.
        waiting: Messages the broker holds that no consumer was handed yet (SQS:
            ``ApproximateNumberOfMessages``); ``None`` when it does not count them.
        in_flight: Messages handed to a consumer and not advanced yet (SQS:
            ``ApproximateNumberOfMessagesNotVisible``); ``None`` likewise.
        measured_at: Wall-clock time (``time.time()``) of the measurement.
    """

    lanes: Mapping[Hashable, int] = field(default_factory=lambda: _NO_LANES)
    waiting: int | None = None
    in_flight: int | None = None
    measured_at: float = 0.0

    @property
    def total(self) -> int:
        """Every lane's lag plus ``waiting`` (what is yet to be read and advanced)."""
        return sum(self.lanes.values()) + (self.waiting or 0)


@dataclass(frozen=True, slots=True)
class OldestOutstanding:
    """The oldest event a group broadcast and has not advanced yet.

    Attributes:
        lane: Its lane.
        age: Seconds since it was broadcast.
        holders: The subscribers (roster members) that have not resolved it yet, in
            subscription order; ``()`` once every one did and only its advance (or an
            earlier event of its lane's) is pending.
        raw_event: The event as broadcast (a :class:`~ackgate.Service`'s is its
            :class:`~ackgate.Message`), to name it; do not keep it.
    """

    lane: Hashable
    age: float
    holders: tuple[Hashable, ...]
    raw_event: Any


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
            redelivered copies counted acked at once for subscribers that had acked
            an earlier copy, instead of handed to them again.
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
        oldest: The oldest event broadcast and not advanced yet, and who holds it;
            ``None`` when none (and on the fast path).
        behind: Per live subscriber: events broadcast that it has not resolved yet
            (an event of a batch counts until the subscriber's part in the batch is
            resolved). What a slow subscriber is behind the poll.
        broker_lag: What the producer last measured of the broker's backlog
            (:meth:`SharedStreamProducer.broker_lag`); ``None`` when it does not.
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
    oldest: OldestOutstanding | None = None
    behind: Mapping[Hashable, int] = field(default_factory=lambda: _NO_LANES)
    broker_lag: BrokerLag | None = None
