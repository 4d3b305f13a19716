"""A fake Azure Service Bus at the SDK's ``aio`` client / receiver interface.

It stands where ``azure.servicebus.aio.ServiceBusClient`` stands, so the adapter's
own logic runs unchanged; it raises the SDK's real exception types. It enforces the
broker rules the adapter depends on:

* PEEK_LOCK: a received message is locked for ``lock_duration`` (read from an
  injectable clock). An expired lock puts the message back with
  ``delivery_count`` + 1; ``max_delivery_count`` failed deliveries dead-letter it
  (reason ``MaxDeliveryCountExceeded``).
* Settlement: settling a message twice raises ``MessageAlreadySettled``; settling or
  renewing after the lock expired (or after another delivery of it) raises
  ``MessageLockLostError``; on session entities a lost session lock raises
  ``SessionLockLostError``. Abandon redelivers with ``delivery_count`` + 1;
  dead-letter moves to the entity's ``$deadletterqueue`` sub-queue with its reason.
* Sessions: a session is locked by one receiver at a time (``SessionCannotBeLocked``
  otherwise), its messages are delivered in sequence order, its lock expires like a
  message lock and is renewed with ``receiver.session.renew_lock()``; session
  messages have no lock of their own (``locked_until_utc`` is ``None``).
  ``NEXT_AVAILABLE_SESSION`` takes an unlocked session with messages, or raises
  ``OperationTimeoutError`` after the receiver's ``max_wait_time``.

Not modelled: prefetch, scheduled messages, deferral, TTL, transfer queues.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

_POLL = 0.02  # seconds between lock-expiry checks while a receive waits


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout <= 0:
        raise ValueError("The timeout must be greater than 0.")


class ManualClock:
    """A UTC clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass(eq=False)
class _Stored:
    sequence_number: int
    body: bytes
    message_id: str
    session_id: str | None
    application_properties: dict[str, Any]
    delivery_count: int = 0
    lock_token: str | None = None
    locked_until: datetime | None = None
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None


@dataclass(eq=False)
class _SessionLock:
    owner: FakeReceiver
    locked_until: datetime


@dataclass(eq=False)
class FakeEntity:
    """A queue, a topic subscription, or a dead-letter sub-queue of one."""

    name: str
    requires_session: bool
    lock_duration: timedelta
    max_delivery_count: int
    dead_letter: FakeEntity | None = None
    messages: list[_Stored] = field(default_factory=list)  # not settled, sequence order
    completed: list[_Stored] = field(default_factory=list)
    sessions: dict[str, _SessionLock] = field(default_factory=dict)

    @property
    def dead_lettered(self) -> list[_Stored]:
        assert self.dead_letter is not None
        return self.dead_letter.messages

    def active_count(self) -> int:
        return len(self.messages)


class FakeServiceBus:
    """The broker: entities, a clock, fault injection and an operation log.

    ``log`` records ``(operation, sequence_number or session_id)`` for every
    ``receive``, ``complete``, ``abandon``, ``dead_letter``, ``renew``,
    ``renew_session``, ``expire`` and ``max_delivery``. ``renew_faults`` and
    ``settle_faults`` are lists of exceptions raised (and removed) by the next
    renewals / settlements before the broker is touched. ``renew_delay`` is the
    seconds every lock renewal (message or session) spends on the way to the broker,
    which then checks and renews the lock; ``max_renewals_in_flight`` is the most
    renewals ever under way at once. ``unreachable``, while set, is raised by every
    receive once its wait is over: the namespace cannot be reached (an outage).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        renew_delay: float = 0.0,
    ) -> None:
        self.clock = clock or (lambda: datetime.now(UTC))
        self.lock_duration = timedelta(seconds=lock_duration)
        self.max_delivery_count = max_delivery_count
        self.entities: dict[str, FakeEntity] = {}
        self.topics: dict[str, list[FakeEntity]] = {}
        self.log: list[tuple[str, Any]] = []
        self.renew_faults: list[Exception] = []
        self.settle_faults: list[Exception] = []
        self.unreachable: Exception | None = None
        self.renew_delay = renew_delay
        self.renewals_in_flight = 0
        self.max_renewals_in_flight = 0
        self.clients: list[FakeServiceBusClient] = []
        self._sequence = itertools.count(1)
        self._changed: asyncio.Event | None = None

    # -- setup and inspection -----------------------------------------------------

    def create_queue(self, name: str, *, requires_session: bool = False) -> FakeEntity:
        entity = self._entity(name, requires_session)
        self.entities[name] = entity
        return entity

    def create_subscription(
        self, topic: str, subscription: str, *, requires_session: bool = False
    ) -> FakeEntity:
        entity = self._entity(f"{topic}/subscriptions/{subscription}", requires_session)
        self.entities[entity.name] = entity
        self.topics.setdefault(topic, []).append(entity)
        return entity

    def send(
        self,
        to: str,
        body: str | bytes,
        *,
        session_id: str | None = None,
        message_id: str | None = None,
        application_properties: dict[str, Any] | None = None,
    ) -> int:
        """Enqueue on a queue, or on every subscription of a topic; returns the sequence number."""
        targets = self.topics.get(to) or [self.entities[to]]
        sequence_number = next(self._sequence)
        for entity in targets:
            if entity.requires_session != (session_id is not None):
                raise ServiceBusError(f"session_id does not match entity {entity.name}")
            entity.messages.append(
                _Stored(
                    sequence_number=sequence_number,
                    body=body.encode() if isinstance(body, str) else body,
                    message_id=message_id or uuid.uuid4().hex,
                    session_id=session_id,
                    application_properties=dict(application_properties or {}),
                )
            )
        self.notify()
        return sequence_number

    def client(self) -> FakeServiceBusClient:
        client = FakeServiceBusClient(self)
        self.clients.append(client)
        return client

    def ops(self, operation: str) -> list[Any]:
        return [key for op, key in self.log if op == operation]

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, re-checked on every change and lock expiry."""
        while True:
            self.expire_locks()
            if predicate():
                return
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            try:
                async with asyncio.timeout(_POLL):
                    await changed.wait()
            except TimeoutError:
                pass

    # -- broker internals ---------------------------------------------------------

    async def renewal_round_trip(self) -> None:
        """The way of one renewal to the broker: ``renew_delay`` seconds, counted in flight."""
        self.renewals_in_flight += 1
        self.max_renewals_in_flight = max(self.max_renewals_in_flight, self.renewals_in_flight)
        try:
            if self.renew_delay:
                await asyncio.sleep(self.renew_delay)
        finally:
            self.renewals_in_flight -= 1

    def _entity(self, name: str, requires_session: bool) -> FakeEntity:
        dead_letter = FakeEntity(
            f"{name}/$deadletterqueue", False, self.lock_duration, self.max_delivery_count
        )
        return FakeEntity(
            name, requires_session, self.lock_duration, self.max_delivery_count, dead_letter
        )

    def notify(self) -> None:
        """Wake every ``wait_until``: the broker's state changed."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def expire_locks(self) -> None:
        """Release every lock whose time is up (the broker does this on its own)."""
        now = self.clock()
        changed = False
        entities = list(self.entities.values())
        for entity in entities + [e.dead_letter for e in entities if e.dead_letter]:
            for session_id, lock in list(entity.sessions.items()):
                if lock.locked_until <= now:
                    self.log.append(("expire", session_id))
                    self.release_session(entity, session_id)
                    changed = True
            for stored in list(entity.messages):
                locked_until = stored.locked_until
                if locked_until is not None and locked_until <= now:
                    self.log.append(("expire", stored.sequence_number))
                    self.release(entity, stored)
                    changed = True
        if changed:
            self.notify()

    def release(self, entity: FakeEntity, stored: _Stored) -> None:
        """Unlock a failed delivery: count it, and dead-letter it past the maximum."""
        stored.lock_token = None
        stored.locked_until = None
        stored.delivery_count += 1
        if stored.delivery_count >= entity.max_delivery_count:
            self.log.append(("max_delivery", stored.sequence_number))
            self.move_to_dead_letter(entity, stored, "MaxDeliveryCountExceeded", "")

    def release_session(self, entity: FakeEntity, session_id: str) -> None:
        lock = entity.sessions.pop(session_id)
        lock.owner.session_lost = True
        for stored in list(entity.messages):
            if stored.session_id == session_id and stored.lock_token is not None:
                self.release(entity, stored)

    def move_to_dead_letter(
        self, entity: FakeEntity, stored: _Stored, reason: str | None, description: str | None
    ) -> None:
        entity.messages.remove(stored)
        assert entity.dead_letter is not None
        stored.lock_token = None
        stored.locked_until = None
        stored.dead_letter_reason = reason
        stored.dead_letter_error_description = description
        entity.dead_letter.messages.append(stored)


class FakeReceivedMessage:
    """The part of ``ServiceBusReceivedMessage`` a consumer reads."""

    def __init__(self, stored: _Stored, receiver: FakeReceiver) -> None:
        self._stored = stored
        self._receiver = receiver
        self._settled = False
        self._lock_token = stored.lock_token
        self._expiry = stored.locked_until
        self.body = stored.body
        self.message_id = stored.message_id
        self.sequence_number = stored.sequence_number
        self.session_id = stored.session_id
        self.delivery_count = stored.delivery_count
        self.application_properties = dict(stored.application_properties)
        self.dead_letter_reason = stored.dead_letter_reason
        self.dead_letter_error_description = stored.dead_letter_error_description

    @property
    def lock_token(self) -> str | None:
        return None if self._settled else self._lock_token

    @property
    def locked_until_utc(self) -> datetime | None:
        if self._settled or self._receiver.session is not None:
            return None
        return self._expiry

    def __str__(self) -> str:
        return self.body.decode()


class FakeSession:
    """``receiver.session``: the session lock of a session receiver."""

    def __init__(self, receiver: FakeReceiver, session_id: str | None) -> None:
        self._receiver = receiver
        self.session_id = session_id

    @property
    def locked_until_utc(self) -> datetime | None:
        lock = self._receiver.session_lock()
        return None if lock is None else lock.locked_until

    async def renew_lock(self, *, timeout: float | None = None) -> datetime:  # noqa: ASYNC109 - the SDK's signature
        _check_timeout(timeout)
        bus = self._receiver.bus
        self._receiver.check_live()
        await bus.renewal_round_trip()
        if bus.renew_faults:
            raise bus.renew_faults.pop(0)
        lock = self._receiver.session_lock()
        if lock is None:
            raise SessionLockLostError()
        lock.locked_until = bus.clock() + self._receiver.entity.lock_duration
        bus.log.append(("renew_session", self.session_id))
        return lock.locked_until


class FakeReceiver:
    """``azure.servicebus.aio.ServiceBusReceiver`` in PEEK_LOCK mode."""

    def __init__(
        self, bus: FakeServiceBus, entity: FakeEntity, session_id: Any, max_wait_time: float | None
    ) -> None:
        self.bus = bus
        self.entity = entity
        self.max_wait_time = max_wait_time
        self.closed = False
        self.session_lost = False
        self.session: FakeSession | None = None
        self._next_available = session_id is NEXT_AVAILABLE_SESSION
        if session_id is not None:
            self.session = FakeSession(self, None if self._next_available else session_id)

    def check_live(self) -> None:
        if self.closed:
            raise ValueError("The handler has already been shutdown.")

    def session_lock(self) -> _SessionLock | None:
        """This receiver's session lock, or None once it expired or was taken away."""
        self.bus.expire_locks()
        if self.session is None or self.session.session_id is None:
            return None
        lock = self.entity.sessions.get(self.session.session_id)
        return lock if lock is not None and lock.owner is self else None

    async def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[FakeReceivedMessage]:
        self.check_live()
        if self.bus.unreachable is not None:
            # After the wait, as the SDK raises only once its own retries are spent.
            await asyncio.sleep(max_wait_time or self.max_wait_time or 60.0)
            raise self.bus.unreachable
        if self.entity.requires_session != (self.session is not None):
            raise ServiceBusError(f"session receiver mismatch on {self.entity.name}")
        if self.session is not None:
            await self._acquire_session()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (max_wait_time or self.max_wait_time or 60.0)
        while True:
            taken = self._take(max_message_count or 1)
            if taken or loop.time() >= deadline:
                return taken
            await self.bus.wait_until(
                lambda: loop.time() >= deadline or self._available() or self.session_lost
            )

    async def _acquire_session(self) -> None:
        assert self.session is not None
        if self.session.session_id is not None:
            if self.session_lock() is not None:
                return
            if self.session_lost:
                raise SessionLockLostError()
            self._lock_session(self.session.session_id)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.max_wait_time or 60.0)
        while (session_id := self._free_session()) is None:
            if loop.time() >= deadline:
                raise OperationTimeoutError(message="No session available.")
            await self.bus.wait_until(
                lambda: loop.time() >= deadline or self._free_session() is not None
            )
        self.session.session_id = session_id
        self._lock_session(session_id)

    def _lock_session(self, session_id: str) -> None:
        lock = self.entity.sessions.get(session_id)
        if lock is not None and lock.owner is not self:
            raise SessionCannotBeLockedError()
        until = self.bus.clock() + self.entity.lock_duration
        self.entity.sessions[session_id] = _SessionLock(self, until)

    def _free_session(self) -> str | None:
        for stored in self.entity.messages:
            if stored.session_id not in self.entity.sessions and stored.lock_token is None:
                return stored.session_id
        return None

    def _available(self) -> bool:
        return any(self._deliverable(stored) for stored in self.entity.messages)

    def _deliverable(self, stored: _Stored) -> bool:
        if stored.lock_token is not None:
            return False
        if self.session is None:
            return True
        return stored.session_id == self.session.session_id and self.session_lock() is not None

    def _take(self, count: int) -> list[FakeReceivedMessage]:
        self.bus.expire_locks()
        if self.session is not None and self.session_lock() is None:
            raise SessionLockLostError()
        taken: list[FakeReceivedMessage] = []
        for stored in self.entity.messages:
            if len(taken) == count:
                break
            if self._deliverable(stored):
                stored.lock_token = uuid.uuid4().hex
                if self.session is None:
                    stored.locked_until = self.bus.clock() + self.entity.lock_duration
                else:
                    stored.locked_until = None
                self.bus.log.append(("receive", stored.sequence_number))
                taken.append(FakeReceivedMessage(stored, self))
        return taken

    def _check_lock(self, message: FakeReceivedMessage, action: str) -> _Stored:
        """The stored message if ``message`` still holds its lock, else the SDK's error."""
        self.check_live()
        if message._settled:
            raise MessageAlreadySettled(action=action)
        self.bus.expire_locks()
        stored = message._stored
        if self.session is not None:
            if self.session_lock() is None:
                raise SessionLockLostError()
        elif stored.lock_token != message._lock_token or stored not in self.entity.messages:
            raise MessageLockLostError()
        return stored

    async def _settle(self, message: FakeReceivedMessage, action: str) -> _Stored:
        stored = self._check_lock(message, action)
        if self.bus.settle_faults:
            raise self.bus.settle_faults.pop(0)
        message._settled = True
        self.bus.log.append((action, stored.sequence_number))
        return stored

    async def complete_message(self, message: FakeReceivedMessage) -> None:
        stored = await self._settle(message, "complete")
        self.entity.messages.remove(stored)
        self.entity.completed.append(stored)
        self.bus.notify()

    async def abandon_message(self, message: FakeReceivedMessage) -> None:
        stored = await self._settle(message, "abandon")
        self.bus.release(self.entity, stored)
        self.bus.notify()

    async def dead_letter_message(
        self,
        message: FakeReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        stored = await self._settle(message, "dead_letter")
        self.bus.move_to_dead_letter(self.entity, stored, reason, error_description)
        self.bus.notify()

    async def renew_message_lock(
        self,
        message: FakeReceivedMessage,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the SDK's signature
    ) -> datetime:
        _check_timeout(timeout)
        if self.session is not None:
            raise TypeError("Renewing message lock is an invalid operation with sessions.")
        await self.bus.renewal_round_trip()
        stored = self._check_lock(message, "renew")
        if self.bus.renew_faults:
            raise self.bus.renew_faults.pop(0)
        stored.locked_until = self.bus.clock() + self.entity.lock_duration
        message._expiry = stored.locked_until
        self.bus.log.append(("renew", stored.sequence_number))
        return stored.locked_until

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # A closed session receiver gives its session back; message locks of a
        # session-less receiver simply run out.
        if self.session is not None and self.session_lock() is not None:
            assert self.session.session_id is not None
            self.bus.release_session(self.entity, self.session.session_id)
            self.bus.notify()


class FakeServiceBusClient:
    """``azure.servicebus.aio.ServiceBusClient``: hands out receivers, closes them all."""

    def __init__(self, bus: FakeServiceBus) -> None:
        self.bus = bus
        self.closed = False
        self.receivers: list[FakeReceiver] = []

    def get_queue_receiver(self, queue_name: str, **options: Any) -> FakeReceiver:
        return self._receiver(queue_name, **options)

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **options: Any
    ) -> FakeReceiver:
        return self._receiver(f"{topic_name}/subscriptions/{subscription_name}", **options)

    def _receiver(
        self,
        name: str,
        *,
        session_id: Any = None,
        sub_queue: Any = None,
        receive_mode: Any = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        prefetch_count: int = 0,
    ) -> FakeReceiver:
        if self.closed:
            raise ValueError("The client has been closed.")
        if receive_mode != ServiceBusReceiveMode.PEEK_LOCK:
            raise NotImplementedError("the fake models PEEK_LOCK only")
        entity = self.bus.entities[name]
        if sub_queue is not None:
            assert ServiceBusSubQueue(sub_queue) == ServiceBusSubQueue.DEAD_LETTER
            assert entity.dead_letter is not None and session_id is None
            entity = entity.dead_letter
        receiver = FakeReceiver(self.bus, entity, session_id, max_wait_time)
        self.receivers.append(receiver)
        return receiver

    async def close(self) -> None:
        self.closed = True
        for receiver in self.receivers:
            await receiver.close()
