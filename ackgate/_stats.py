"""Point-in-time statistics of a live group."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class GroupStats:
    """A snapshot of one live group, as returned by ``SharedStreamManager.stats()``."""

    key: Hashable
    mode: Literal["ack", "fast"]
    #: Live subscriptions that are not force-failed.
    subscribers: int
    #: Events broadcast and not yet advanced (ack mode; 0 on the fast path).
    outstanding: int
    #: Lanes with outstanding events.
    lanes: int
    #: Seconds since the oldest outstanding event was broadcast; 0.0 when none.
    oldest_outstanding_age: float
    advanced_events: int
    advance_calls: int
    #: Live subscriptions that were force-failed and have not left yet.
    failed_subscribers: int
    #: Rostered groups: broadcasting nothing new because a member is not healthy.
    paused: bool = False
    #: Rostered groups: the roster members not attached or force-failed, in roster
    #: order; ``()`` for dynamic groups.
    missing: tuple[Hashable, ...] = ()
    #: Deliveries saved (SPEC §13): redelivered copies counted acked at once for
    #: subscribers that had acked an earlier copy, instead of handed to them again.
    redeliveries_skipped: int = 0
