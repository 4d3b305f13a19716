"""What every layer of a group (:mod:`ackgate._core.group`) shares: its configuration and
its state, declared once here and set by ``Group.__init__``.

A group is one object built in layers, one concept per module, each layer using
only those below it: resolution (:mod:`ackgate._core.resolution`), membership
(:mod:`ackgate._core.membership`), the ack timeout (:mod:`ackgate._core.timeouts`), intake
(:mod:`ackgate._core.intake`: the poll and the fan-out), and the group itself with its
lifecycle (:mod:`ackgate._core.group`). The one call upward, ``terminate``, is declared
here.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

from ackgate._contract.errors import StreamTerminated
from ackgate._contract.producer import SharedStreamProducer
from ackgate._contract.upstream import Upstream
from ackgate._core.bindings import OutputRegistry
from ackgate._core.fanout import EventLog, Run
from ackgate._core.progress import GroupProgress
from ackgate._core.redelivery import RedeliveryMemory
from ackgate._core.subscription import Subscription
from ackgate._core.tracker import LaneTracker


@dataclass(frozen=True, slots=True)
class GroupConfig:
    ack_timeout: float
    subscriber_queue_size: int
    cohort_grace_period: float
    max_concurrent_advances: int
    overflow: Literal["fail", "block"]
    clock: Callable[[], float]
    max_outstanding: int


class GroupState(ABC):
    """The attributes of a group; their meaning and invariants are documented where
    ``Group.__init__`` sets them."""

    key: Hashable
    upstream: Upstream
    roster: tuple[Hashable, ...] | None
    ack_mode: bool
    bindings: OutputRegistry
    log: EventLog
    tracker: LaneTracker
    members: dict[Hashable, Subscription]
    active: set[Subscription]
    departed: set[Subscription]
    waiters: set[asyncio.Future[None]]
    joins: int
    blocked: bool
    room: asyncio.Event
    _healthy: asyncio.Event
    _ever_healthy: bool
    _pause_warning: asyncio.Task[None] | None
    terminal: tuple[type[StreamTerminated], str, BaseException | None] | None
    _config: GroupConfig
    _factory: Callable[[], Any]
    clock: Callable[[], float]
    ack_timeout: float
    _queue_size: int
    _min_cursor_hint: int
    unresolved: deque[Run]
    _timer_wakeup: asyncio.Future[None] | None
    _sleep_until: Callable[[float], Awaitable[None]] | None
    _producer: SharedStreamProducer | None
    redelivery: RedeliveryMemory
    progress: GroupProgress
    redeliveries_skipped: int
    redeliveries_skipped_by: dict[Hashable, int]
    _poll_exited: bool
    stop_task: asyncio.Task[None] | None
    _get_event_id: Callable[[Any], Hashable] | None
    _poll_task: asyncio.Task[None]

    @abstractmethod
    def terminate(
        self,
        kind: type[StreamTerminated],
        reason: str,
        cause: BaseException | None = None,
    ) -> None:
        """End the group (first reason wins) and start its stop (``ackgate._core.group``)."""
