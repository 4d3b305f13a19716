"""The manager: the registry of groups and the public entry point."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Iterable
from types import MappingProxyType, TracebackType
from typing import Any, Literal

from ackgate._contract.checks import check_int, check_number
from ackgate._contract.errors import StreamTerminated
from ackgate._contract.producer import SharedStreamProducer
from ackgate._contract.stats import GroupStats
from ackgate._contract.upstream import Upstream
from ackgate._core.bindings import OutputRegistry
from ackgate._core.group import Group
from ackgate._core.group_state import GroupConfig
from ackgate._core.run_subscriber import Handler, Sink, drive
from ackgate._core.subscription import Subscription, _check_reason

_NOTHING: MappingProxyType[Hashable, int] = MappingProxyType({})


class SharedStreamManager:
    """Groups subscribers by key: one upstream poll per key, fanned out to all of them.

    Use it as an async context manager (or call :meth:`aclose`); leaving stops every
    group: polling is cancelled, resolved events are advanced, producers closed.
    All arguments are keyword-only and validated at once (``ValueError`` naming
    the argument). ``clock`` is the monotonic time source used for ack timeouts and
    ages; tests inject a fake one. A clock object may also offer
    ``sleep_until(deadline) -> Awaitable[None]``, resolved once ``clock() >=
    deadline``: the ack-timeout timers then wait through it, so moving a fake clock
    fires them (``ackgate.testing.FakeClock`` does this); otherwise they sleep on
    the event loop's time.

    ``max_outstanding`` (docs/production.md#max_outstanding) caps the events a group holds broadcast
    and not yet advanced: at the cap the group stops pulling the upstream until advances make room,
    whatever is slow (a subscriber, unconfirmed outputs, ``advance`` itself). Backpressure, not
    failure. A subscriber that waits for more events before it confirms what it bound (confirming in
    batches) must use batches smaller than this, or it waits until the ack timeout.
    """

    def __init__(
        self,
        *,
        ack_timeout: float = 300.0,
        subscriber_queue_size: int = 1024,
        cohort_grace_period: float = 0.0,
        max_concurrent_advances: int = 1,
        overflow: Literal["fail", "block"] = "fail",
        clock: Callable[[], float] = time.monotonic,
        max_outstanding: int = 65536,
    ) -> None:
        if overflow not in ("fail", "block"):
            raise ValueError(f'overflow must be "fail" or "block", got {overflow!r}')
        if not callable(clock):
            raise ValueError(f"clock must be a zero-argument callable, got {clock!r}")
        self._config = GroupConfig(
            ack_timeout=check_number(
                "ack_timeout", ack_timeout, minimum=0, inclusive=False, finite=False
            ),
            subscriber_queue_size=check_int(
                "subscriber_queue_size", subscriber_queue_size, minimum=1
            ),
            cohort_grace_period=check_number(
                "cohort_grace_period", cohort_grace_period, minimum=0, finite=False
            ),
            max_concurrent_advances=check_int(
                "max_concurrent_advances", max_concurrent_advances, minimum=1
            ),
            overflow=overflow,
            clock=clock,
            max_outstanding=check_int("max_outstanding", max_outstanding, minimum=1),
        )
        self._groups: dict[Hashable, Group] = {}
        #: Upstreams of ended groups that were down when their group ended, by key:
        #: the next group of the key carries on the same outage, so a restart in the
        #: middle of one logs neither a second WARNING nor a spurious INFO.
        self._down_upstreams: dict[Hashable, Upstream] = {}
        self._stopping: set[Group] = set()
        self._bindings = OutputRegistry()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closed = False

    # -- subscribing ---------------------------------------------------------------

    def subscribe(
        self,
        key: Hashable,
        subscriber_id: Hashable,
        *,
        producer: Callable[[], SharedStreamProducer] | None = None,
        source: Callable[[], AsyncIterator[Any]] | None = None,
        roster: Collection[Hashable] | None = None,
    ) -> Subscription:
        """Join the group of ``key`` (creating it) and return the subscription.

        Exactly one of ``producer`` (ack mode) or ``source`` (fast path) must be
        given. The subscriber is in the snapshot of every event broadcast from now
        on. Synchronous; needs the manager's event loop to be running.

        ``roster`` declares the group's fixed set of subscriber ids (ack mode only):
        the group starts polling once all of them are attached, every event's
        snapshot is the whole roster, and the group pauses while any member is
        missing or force-failed. Every subscription to a rostered key passes an
        equal roster containing its ``subscriber_id`` (``ValueError`` otherwise).
        """
        if self._closed:
            raise RuntimeError("the SharedStreamManager is closed")
        if (producer is None) == (source is None):
            raise ValueError("give exactly one of producer= (ack mode) or source= (fast path)")
        factory: Callable[[], Any] = producer if producer is not None else source  # type: ignore[assignment]
        if not callable(factory):
            raise ValueError(f"the factory must be a zero-argument callable, got {factory!r}")
        if key is None:
            raise ValueError("key must not be None")
        _check_hashable("key", key)
        _check_hashable("subscriber_id", subscriber_id)
        ack_mode = producer is not None
        members = _check_roster(roster, subscriber_id, ack_mode=ack_mode)
        self._bind_loop()
        group = self._groups.get(key)
        if group is None:
            group = Group(
                key,
                factory,
                ack_mode=ack_mode,
                config=self._config,
                bindings=self._bindings,
                release=self._release,
                roster=members,
                upstream=self._down_upstreams.pop(key, None),
            )
            self._groups[key] = group
        elif group.ack_mode != ack_mode:
            running = "producer" if group.ack_mode else "source"
            raise ValueError(f"key {key!r} already runs a group with {running}=")
        elif group.roster is None and members is not None:
            raise ValueError(f"key {key!r} runs a dynamic group; it cannot take a roster")
        elif group.roster is not None and members is None:
            raise ValueError(f"key {key!r} runs a rostered group; pass its roster= too")
        elif group.roster is not None and set(group.roster) != set(members or ()):
            raise ValueError(
                f"roster {list(members or ())!r} differs from the roster of key {key!r}: "
                f"{list(group.roster)!r}"
            )
        if subscriber_id in group.members:
            raise ValueError(f"subscriber {subscriber_id!r} is already subscribed to {key!r}")
        subscription = Subscription(group, subscriber_id, group.log.head)
        group.join(subscription)
        return subscription

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._loop_thread = threading.get_ident()
        elif self._loop is not loop:
            raise RuntimeError("a SharedStreamManager is bound to the event loop it first ran on")

    def _release(self, group: Group) -> None:
        """Caller: a group that ended. Frees its key at once."""
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        if not group.upstream.connected:
            self._down_upstreams[group.key] = group.upstream
        assert group.stop_task is not None
        self._stopping.add(group)
        group.stop_task.add_done_callback(lambda _: self._stopping.discard(group))

    # -- confirming ----------------------------------------------------------------

    def confirm_persisted(self, seqs: Iterable[int]) -> None:
        """Mark the outputs with these sequence numbers as durably stored.

        Accepts any iterable; items that are unknown or stale numbers, or not
        ints at all, are ignored. A non-iterable is a ``TypeError``. Safe to call
        from any task, and from other threads (the call is handed to the
        manager's loop; once that loop is closed, the call does nothing).
        """
        if not isinstance(seqs, Iterable):
            raise TypeError(f"confirm_persisted takes an iterable of ints, got {seqs!r}")
        if self._in_loop(self._bindings.confirm, seqs):
            self._bindings.confirm(seqs)

    def reject_bound(self, seqs: Iterable[int], reason: str | None = None) -> None:
        """Reject the events these outputs are bound to (docs/concepts.md#deferred-resolution).

        The event each live number is bound to resolves as ``rejected`` for the
        subscriber that bound it, at once: whether its window is still open or
        closed, and after the subscriber left. The first resolution of an event
        for a subscriber wins: later calls for it, and its other numbers, do
        nothing. ``reason`` (a ``str``, else ``TypeError``) reaches the producer as
        ``"<subscriber_id>: <reason>"`` in ``AdvanceOutcome.reasons``. Accepts any
        iterable; unknown or stale numbers and non-ints are ignored. Safe to call
        from any task and from other threads, as :meth:`confirm_persisted`.
        """
        if not isinstance(seqs, Iterable):
            raise TypeError(f"reject_bound takes an iterable of ints, got {seqs!r}")
        _check_reason(reason)
        if self._in_loop(self._bindings.resolve, seqs, "rejected", reason):
            self._bindings.resolve(seqs, "rejected", reason)

    def fail_bound(self, seqs: Iterable[int]) -> None:
        """Fail the events these outputs are bound to (docs/concepts.md#deferred-resolution): as
        :meth:`reject_bound`, but each resolves as ``failed`` for its subscriber,
        so the broker redelivers it."""
        if not isinstance(seqs, Iterable):
            raise TypeError(f"fail_bound takes an iterable of ints, got {seqs!r}")
        if self._in_loop(self._bindings.resolve, seqs, "failed", None):
            self._bindings.resolve(seqs, "failed", None)

    def reject_in_batch(self, seq: int, indexes: Iterable[int], reason: str | None = None) -> None:
        """Reject some events of a batch (:meth:`Subscription.pull_batch`): the events
        at ``indexes`` of the batch bound to ``seq`` resolve as ``rejected`` for its
        subscriber at once; the others stay bound to ``seq`` (confirm it to ack
        them). An event already resolved for the subscriber is left as it is, and an
        index outside the batch is logged at WARNING and ignored. ``reason`` as in
        :meth:`reject_bound`. A ``seq`` that is not a live batch number is ignored.
        Safe to call from any task and from other threads, as
        :meth:`confirm_persisted`.
        """
        if not isinstance(indexes, Iterable):
            raise TypeError(f"reject_in_batch takes an iterable of indexes, got {indexes!r}")
        _check_reason(reason)
        if self._in_loop(self._bindings.reject_in_batch, indexes, seq, reason):
            self._bindings.reject_in_batch(list(indexes), seq, reason)

    def _in_loop(self, call: Callable[..., None], seqs: Iterable[int], *args: Any) -> bool:
        """True if the caller is on the manager's loop and should ``call`` itself.

        From another thread, hands ``call`` to the loop instead; a loop that never
        ran or is closed already has nothing to resolve, so the call is dropped.
        """
        loop = self._loop
        if loop is None:
            return False
        if threading.get_ident() == self._loop_thread:
            return True
        with contextlib.suppress(RuntimeError):  # the loop is closed: all numbers are stale
            loop.call_soon_threadsafe(call, list(seqs), *args)
        return False

    # -- the runner ----------------------------------------------------------------

    async def run_subscriber(
        self,
        key: Hashable,
        subscriber_id: Hashable,
        handle: Handler,
        *,
        producer: Callable[[], SharedStreamProducer] | None = None,
        source: Callable[[], AsyncIterator[Any]] | None = None,
        sink: Sink | None = None,
        roster: Collection[Hashable] | None = None,
    ) -> None:
        """Subscribe, run ``handle(subscription)``, and persist what it yields.

        For each output: bind it, ``await sink(output)`` if given, confirm it.
        Returns when ``handle`` returns; re-raises the subscription's failure or
        ``handle``'s exception. Leaves on every exit; cancellation fails the open
        event and propagates. ``roster`` is passed to :meth:`subscribe`.
        """
        subscription = self.subscribe(
            key, subscriber_id, producer=producer, source=source, roster=roster
        )
        await drive(subscription, handle, sink, self.confirm_persisted)

    # -- observing -----------------------------------------------------------------

    def stats(self) -> list[GroupStats]:
        """One :class:`GroupStats` per live group. O(subscribers + lanes) per group."""
        now = self._config.clock()
        result = []
        for group in self._groups.values():
            tracker = group.tracker
            oldest = group.oldest_outstanding(now) if group.ack_mode else None
            producer = tracker.producer
            failed = sum(1 for sub in group.members.values() if sub._failure is not None)
            result.append(
                GroupStats(
                    key=group.key,
                    mode="ack" if group.ack_mode else "fast",
                    subscribers=len(group.members) - failed,
                    outstanding=tracker.outstanding,
                    lanes=sum(1 for lane in tracker.lanes.values() if lane.runs or lane.in_flight),
                    oldest_outstanding_age=0.0 if oldest is None else oldest.age,
                    advanced_events=tracker.advanced_events,
                    advance_calls=tracker.advance_calls,
                    failed_subscribers=failed,
                    paused=group.paused,
                    missing=group.missing(),
                    redeliveries_skipped=group.redeliveries_skipped,
                    progress_overflows=group.progress.overflows,
                    upstream_connected=group.upstream.connected,
                    upstream_down_since=group.upstream.down_since,
                    oldest=oldest,
                    behind=MappingProxyType(group.behind()) if group.ack_mode else _NOTHING,
                    broker_lag=None if producer is None else producer.broker_lag(),
                )
            )
        return result

    # -- closing -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop every group: polling cancelled, resolved events advanced, producers
        closed. Subscriptions still iterating get ``StreamTerminated``. Idempotent.

        Cancellation while waiting does not interrupt the groups' shutdown.
        """
        self._closed = True
        for group in list(self._groups.values()):
            group.terminate(StreamTerminated, "the manager was closed")
        stops = [g.stop_task for g in self._stopping if g.stop_task is not None]
        if stops:
            await asyncio.shield(asyncio.gather(*stops, return_exceptions=True))

    async def __aenter__(self) -> SharedStreamManager:
        self._bind_loop()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """:meth:`aclose`, whatever the exit."""
        await self.aclose()


def _check_roster(
    roster: Collection[Hashable] | None, subscriber_id: Hashable, *, ack_mode: bool
) -> tuple[Hashable, ...] | None:
    """The roster's distinct ids in the order given, or ``None`` for a dynamic group."""
    if roster is None:
        return None
    if not ack_mode:
        raise ValueError("a source= (fast path) group cannot have a roster")
    if isinstance(roster, str | bytes) or not isinstance(roster, Collection):
        raise ValueError(f"roster must be a collection of subscriber ids, got {roster!r}")
    for member in roster:
        _check_hashable("every roster member", member)
    members = tuple(dict.fromkeys(roster))
    if not members:
        raise ValueError("roster must not be empty")
    if subscriber_id not in members:
        raise ValueError(f"subscriber {subscriber_id!r} is not in the roster {list(members)!r}")
    return members


def _check_hashable(name: str, value: object) -> None:
    try:
        hash(value)
    except TypeError:
        raise ValueError(f"{name} must be hashable, got {type(value).__name__}") from None
