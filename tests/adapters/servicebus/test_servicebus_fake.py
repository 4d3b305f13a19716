"""The fake enforces the broker rules the adapter's tests rely on (deterministic clock)."""

from __future__ import annotations

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    OperationTimeoutError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from .fake_servicebus import FakeServiceBus, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def bus(clock: ManualClock) -> FakeServiceBus:
    bus = FakeServiceBus(clock=clock, lock_duration=30, max_delivery_count=3)
    bus.create_queue("q")
    bus.create_queue("s", requires_session=True)
    return bus


async def test_expired_lock_redelivers_and_refuses_settlement(
    bus: FakeServiceBus, clock: ManualClock
) -> None:
    bus.send("q", "a")
    receiver = bus.client().get_queue_receiver("q")
    [first] = await receiver.receive_messages(max_wait_time=0.1)
    assert first.delivery_count == 0
    clock.advance(31)
    with pytest.raises(MessageLockLostError):
        await receiver.complete_message(first)
    with pytest.raises(MessageLockLostError):
        await receiver.renew_message_lock(first)
    [second] = await receiver.receive_messages(max_wait_time=0.1)
    assert (str(second), second.delivery_count) == ("a", 1)
    await receiver.complete_message(second)
    assert [m.body for m in bus.entities["q"].completed] == [b"a"]


async def test_renewal_extends_the_lock(bus: FakeServiceBus, clock: ManualClock) -> None:
    bus.send("q", "a")
    receiver = bus.client().get_queue_receiver("q")
    [message] = await receiver.receive_messages(max_wait_time=0.1)
    for _ in range(3):
        clock.advance(20)
        await receiver.renew_message_lock(message)
    assert message.locked_until_utc == clock.now + bus.lock_duration
    await receiver.complete_message(message)
    assert bus.ops("expire") == []


async def test_settling_twice_raises_already_settled(bus: FakeServiceBus) -> None:
    bus.send("q", "a")
    receiver = bus.client().get_queue_receiver("q")
    [message] = await receiver.receive_messages(max_wait_time=0.1)
    await receiver.complete_message(message)
    with pytest.raises(MessageAlreadySettled):
        await receiver.abandon_message(message)
    with pytest.raises(MessageAlreadySettled):
        await receiver.complete_message(message)


async def test_abandon_redelivers_until_max_delivery_count_dead_letters(
    bus: FakeServiceBus,
) -> None:
    bus.send("q", "a")
    receiver = bus.client().get_queue_receiver("q")
    counts = []
    for _ in range(3):
        [message] = await receiver.receive_messages(max_wait_time=0.1)
        counts.append(message.delivery_count)
        await receiver.abandon_message(message)
    assert counts == [0, 1, 2]
    assert await receiver.receive_messages(max_wait_time=0.05) == []
    assert [m.dead_letter_reason for m in bus.entities["q"].dead_lettered] == [
        "MaxDeliveryCountExceeded"
    ]


async def test_dead_letter_moves_to_the_sub_queue_with_reason(bus: FakeServiceBus) -> None:
    bus.send("q", "poison", message_id="m-1")
    client = bus.client()
    receiver = client.get_queue_receiver("q")
    [message] = await receiver.receive_messages(max_wait_time=0.1)
    await receiver.dead_letter_message(message, reason="bad", error_description="why")
    dlq = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = await dlq.receive_messages(max_wait_time=0.1)
    assert (dead.message_id, dead.dead_letter_reason, dead.dead_letter_error_description) == (
        "m-1",
        "bad",
        "why",
    )


async def test_session_delivers_in_order_to_one_holder(
    bus: FakeServiceBus, clock: ManualClock
) -> None:
    for body in ("1", "2", "3"):
        bus.send("s", body, session_id="A")
    bus.send("s", "x", session_id="B")
    client = bus.client()
    holder = client.get_queue_receiver("s", session_id="A")
    got = await holder.receive_messages(max_message_count=10, max_wait_time=0.1)
    assert [str(m) for m in got] == ["1", "2", "3"]
    assert all(m.locked_until_utc is None for m in got)
    with pytest.raises(TypeError):
        await holder.renew_message_lock(got[0])
    with pytest.raises(SessionCannotBeLockedError):
        await client.get_queue_receiver("s", session_id="A").receive_messages(max_wait_time=0.1)
    other = client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.1)
    [x] = await other.receive_messages(max_wait_time=0.1)
    assert (x.session_id, str(x)) == ("B", "x")
    await holder.abandon_message(got[0])
    [again] = await holder.receive_messages(max_wait_time=0.1)
    assert (str(again), again.delivery_count) == ("1", 1)


async def test_session_lock_expiry_loses_the_session(
    bus: FakeServiceBus, clock: ManualClock
) -> None:
    bus.send("s", "1", session_id="A")
    receiver = bus.client().get_queue_receiver("s", session_id="A")
    [message] = await receiver.receive_messages(max_wait_time=0.1)
    clock.advance(20)
    assert receiver.session is not None
    await receiver.session.renew_lock()
    clock.advance(20)
    await receiver.complete_message(message)  # renewed: still held
    bus.send("s", "2", session_id="A")
    [second] = await receiver.receive_messages(max_wait_time=0.1)
    clock.advance(31)
    with pytest.raises(SessionLockLostError):
        await receiver.complete_message(second)
    with pytest.raises(SessionLockLostError):
        await receiver.session.renew_lock()
    with pytest.raises(SessionLockLostError):
        await receiver.receive_messages(max_wait_time=0.1)


async def test_next_available_times_out_without_sessions(bus: FakeServiceBus) -> None:
    receiver = bus.client().get_queue_receiver(
        "s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.05
    )
    with pytest.raises(OperationTimeoutError):
        await receiver.receive_messages(max_wait_time=0.05)
