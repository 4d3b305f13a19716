"""Keeping the locks of received messages until they are settled (SPEC §10).

What a lost lock means for a message, and why renewal is a task of its own, is
documented with the producer, in :mod:`ackgate_servicebus._producer`. Here: the broker
payload (:class:`Delivery`, which carries its lock state) and :class:`LockKeeper`, which
holds the deliveries and renews their locks, or the session's lock on session entities.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ackgate_servicebus._message import ids

_log = logging.getLogger("ackgate.adapters.servicebus")


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
        kept = []
        for delivery in deliveries:
            locked_until = delivery.message.locked_until_utc
            if locked_until is not None and locked_until <= due:
                try:
                    await delivery.receiver.renew_message_lock(
                        delivery.message, timeout=self._margin
                    )
                except Exception as exc:
                    self.held.discard(delivery)
                    _log.warning(
                        "Service Bus lock of %s lapsed before it was received (%s); not "
                        "handed out, the broker redelivers it",
                        ids(delivery.message),
                        type(exc).__name__,
                    )
                    continue
            kept.append(delivery)
        return kept

    async def _run(self) -> None:
        # Runs from open_stream until aclose. One failure loses one lock (or, for a
        # session, the session), never the loop; each call is bounded by the margin
        # so one hung renewal cannot let the other locks lapse.
        margin = timedelta(seconds=self._margin)
        while True:
            await asyncio.sleep(self._margin / 3)
            due = datetime.now(UTC) + margin
            receiver = self._receiver()
            if self._sessionful and receiver is not None and self.session_lost is None:
                await self._renew_session(receiver, due)
            for delivery in list(self.held):
                locked_until = delivery.message.locked_until_utc
                if (
                    delivery.lock_lost
                    or delivery.settling
                    or locked_until is None
                    or locked_until > due
                ):
                    continue
                try:
                    await delivery.receiver.renew_message_lock(
                        delivery.message, timeout=self._margin
                    )
                except Exception as exc:
                    if delivery.settling or delivery not in self.held:
                        continue  # advanced meanwhile: the error is about a settled message
                    delivery.lock_lost = True
                    _log.warning(
                        "Service Bus lock renewal failed for %s (%s); it will not be settled "
                        "and the broker redelivers it",
                        ids(delivery.message),
                        type(exc).__name__,
                    )

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
