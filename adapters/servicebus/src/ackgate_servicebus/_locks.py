"""Keeping the locks of received messages until they are settled
(docs/writing-an-adapter.md#1-the-producer).

What a lost lock means for a message, and why renewal is a task of its own, is
documented with the producer, in :mod:`ackgate_servicebus._producer`. Here: the broker
payload (:class:`Delivery`, which carries its lock state) and :class:`LockKeeper`, which
holds the deliveries and renews their locks, or the session's lock on session entities.

Renewals that fall due together run concurrently, at most :data:`RENEWALS_IN_FLIGHT` at
once (the SDK renews one message per call, and a producer may hold hundreds: one after
another, their round trips would add up past the lock duration).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from ackgate_servicebus._message import ids

_log = logging.getLogger("ackgate.adapters.servicebus")

_T = TypeVar("_T")

RENEWALS_IN_FLIGHT = 32
"""Most lock renewal calls one producer has under way at once: 200 held messages are
renewed in 7 round trips, and the broker is not flooded with one call per message."""


@dataclass(eq=False, slots=True)
class Delivery:
    """The broker payload: one received message and the receiver that must settle it."""

    message: Any
    receiver: Any
    lane: Hashable
    # Set by the renewal loop; once True the message is never settled by us.
    lock_lost: bool = False
    # Set when advance() starts settling, so a racing renewal error is not a loss.
    settling: bool = False


class LockKeeper:
    """Holds the received, unsettled deliveries and keeps their locks.

    Caller: :class:`~ackgate_servicebus.ServiceBusStreamProducer`. It adds to
    :attr:`held` what it receives and removes what it settles or abandons;
    :meth:`start` (in ``open_stream``) runs the renewal loop until :meth:`stop` (in
    ``aclose``). ``margin``: a lock with fewer seconds left than this is renewed; the
    loop wakes every third of it, and no renewal call is given longer than it.
    """

    def __init__(self, margin: float, *, sessionful: bool) -> None:
        self._margin = margin
        self._sessionful = sessionful
        # Invariant: holds exactly the deliveries received and not yet advanced or
        # abandoned in aclose(); the renewal loop renews these and nothing else.
        self.held: set[Delivery] = set()
        # The error of a failed session lock renewal; the stream ends with it.
        self.session_lost: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._receiver: Callable[[], Any] = lambda: None
        # Shared by the loop and renew_on_receipt: the bound is per producer.
        self._slots = asyncio.Semaphore(RENEWALS_IN_FLIGHT)

    def start(self, receiver: Callable[[], Any], name: str) -> None:
        """Start renewing. ``receiver()`` is the producer's current receiver, or None."""
        self._receiver = receiver
        self._task = asyncio.create_task(self._run(), name=name)

    async def stop(self) -> None:
        """Stop renewing; returns once no renewal is in flight."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])

    def check(self) -> None:
        """Raise if the session lock was lost or the renewal loop died."""
        if self.session_lost is not None:
            raise self.session_lost
        if self._task is not None and self._task.done():
            raise RuntimeError("Service Bus lock renewal stopped") from self._task.exception()

    async def renew_on_receipt(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Renew at once the locks about to lapse on receipt (prefetched messages); return
        the deliveries to hand out: those whose lock is lost are dropped from the hold."""
        due = datetime.now(UTC) + timedelta(seconds=self._margin)
        stale = [
            d
            for d in deliveries
            if d.message.locked_until_utc is not None and d.message.locked_until_utc <= due
        ]
        kept = await self._renew_each(stale, self._renew_received)
        lost = {delivery for delivery, ok in zip(stale, kept, strict=True) if not ok}
        return [delivery for delivery in deliveries if delivery not in lost]

    async def _renew_received(self, delivery: Delivery) -> bool:
        """Renew one lock found stale on receipt; whether the lock is kept."""
        try:
            await delivery.receiver.renew_message_lock(delivery.message, timeout=self._margin)
        except Exception as exc:
            self.held.discard(delivery)
            _log.warning(
                "Service Bus lock of %s lapsed before it was received (%s); not "
                "handed out, the broker redelivers it",
                ids(delivery.message),
                type(exc).__name__,
            )
            return False
        return True

    async def _run(self) -> None:
        # Runs from open_stream until aclose. One failure loses one lock (or, for a
        # session, the session), never the loop; each call is bounded by the margin
        # so a hung renewal holds its slot no longer and cannot starve the others.
        margin = timedelta(seconds=self._margin)
        while True:
            await asyncio.sleep(self._margin / 3)
            due = datetime.now(UTC) + margin
            receiver = self._receiver()
            if self._sessionful and receiver is not None and self.session_lost is None:
                await self._renew_session(receiver, due)
            deliveries = [d for d in self.held if _renewal_due(d, due)]
            await self._renew_each(deliveries, functools.partial(self._renew_held, due=due))

    async def _renew_held(self, delivery: Delivery, *, due: datetime) -> None:
        if not _renewal_due(delivery, due):
            return  # settled or lost while it waited for a slot
        try:
            await delivery.receiver.renew_message_lock(delivery.message, timeout=self._margin)
        except Exception as exc:
            if delivery.settling or delivery not in self.held:
                return  # advanced meanwhile: the error is about a settled message
            delivery.lock_lost = True
            _log.warning(
                "Service Bus lock renewal failed for %s (%s); it will not be settled "
                "and the broker redelivers it",
                ids(delivery.message),
                type(exc).__name__,
            )

    async def _renew_each(
        self, deliveries: Iterable[Delivery], renew: Callable[[Delivery], Awaitable[_T]]
    ) -> list[_T]:
        """``renew`` every delivery concurrently, at most RENEWALS_IN_FLIGHT at once; the
        results in order. ``renew`` handles its own errors. Cancellation cancels them all."""

        async def in_slot(delivery: Delivery) -> _T:
            async with self._slots:
                return await renew(delivery)

        return await asyncio.gather(*(in_slot(d) for d in deliveries))

    async def _renew_session(self, receiver: Any, due: datetime) -> None:
        session = receiver.session
        if session is None or session.locked_until_utc is None or session.locked_until_utc > due:
            return
        try:
            await session.renew_lock(timeout=self._margin)
        except Exception as exc:
            if receiver is not self._receiver():
                return  # released by open_stream meanwhile
            self.session_lost = exc
            for delivery in self.held:
                if delivery.receiver is receiver:
                    delivery.lock_lost = True
            _log.warning(
                "Service Bus session lock renewal failed for session_id=%s (%s); "
                "its unsettled messages will be redelivered and the stream ends",
                session.session_id,
                type(exc).__name__,
            )


def _renewal_due(delivery: Delivery, due: datetime) -> bool:
    """Whether the loop renews ``delivery`` now: lock not lost, not being settled, and
    locked until ``due`` or sooner (session messages have no lock of their own: None)."""
    locked_until = delivery.message.locked_until_utc
    return not (delivery.lock_lost or delivery.settling) and (
        locked_until is not None and locked_until <= due
    )
