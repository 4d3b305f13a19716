"""The Service Bus adapter through SharedStreamManager, against the fake broker.

Locks are real-time and short (1 s, renewed when under 0.6 s remain), so lock expiry
and renewal happen within a test; every wait is a broker condition under a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusSubQueue
from azure.servicebus.exceptions import MessageLockLostError, ServiceBusError

from ackgate import SharedStreamManager, StreamTerminated, Subscription
from ackgate_servicebus import (
    DEAD_LETTER_REASON,
    NEXT_AVAILABLE_SESSION,
    ServiceBusStreamProducer,
)
from ackgate_test_support.reject_reasons import REASONS, reject_with_reasons

from .fake_servicebus import FakeServiceBus

LOGGER = "ackgate.adapters.servicebus"
OnEvent = Callable[[Subscription, Any], Awaitable[None]]


@pytest.fixture
def bus() -> FakeServiceBus:
    bus = FakeServiceBus(lock_duration=1.0, max_delivery_count=5)
    bus.create_queue("q")
    bus.create_queue("s", requires_session=True)
    return bus


def factory(bus: FakeServiceBus, **options: Any) -> Callable[[], ServiceBusStreamProducer]:
    options.setdefault("queue_name", "q")

    def make() -> ServiceBusStreamProducer:
        return ServiceBusStreamProducer(
            client_factory=bus.client, max_wait_time=0.05, lock_renewal_margin=0.6, **options
        )

    return make


async def consume(sub: Subscription, count: int, on_event: OnEvent | None = None) -> list[Any]:
    """Read ``count`` events, then leave cleanly (the last one resolves as acked)."""
    seen: list[Any] = []
    async with asyncio.timeout(10), sub:
        async for message in sub:
            seen.append(message)
            if on_event is not None:
                await on_event(sub, message)
            if len(seen) == count:
                break
    return seen


async def test_acked_by_every_subscriber_is_completed(
    bus: FakeServiceBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "ackgate")
    sequence_numbers = [bus.send("q", f"BODY-{i}") for i in range(3)]

    async with SharedStreamManager() as manager:

        async def persist(sub: Subscription, message: Any) -> None:
            seq = sub.bind()
            assert seq is not None
            manager.confirm_persisted([seq])

        subs = [manager.subscribe("orders", name, producer=factory(bus)) for name in "ab"]
        seen = await asyncio.gather(consume(subs[0], 3, persist), consume(subs[1], 3))
    assert [[str(m) for m in got] for got in seen] == [["BODY-0", "BODY-1", "BODY-2"]] * 2
    assert sorted(bus.ops("complete")) == sequence_numbers
    assert bus.ops("abandon") == [] and bus.entities["q"].dead_lettered == []
    assert bus.clients[0].closed
    assert "BODY-" not in caplog.text


async def test_a_rejected_event_is_dead_lettered_with_a_reason(bus: FakeServiceBus) -> None:
    good = bus.send("q", "good")
    bus.send("q", "poison")

    async def picky(sub: Subscription, message: Any) -> None:
        if str(message) == "poison":
            sub.reject()

    async with SharedStreamManager() as manager:
        a = manager.subscribe("orders", "picky", producer=factory(bus))
        b = manager.subscribe("orders", "lenient", producer=factory(bus))
        await asyncio.gather(consume(a, 2, picky), consume(b, 2))
    [dead] = bus.entities["q"].dead_lettered
    assert (dead.body, dead.dead_letter_reason, dead.dead_letter_error_description) == (
        b"poison",
        DEAD_LETTER_REASON,
        "rejected by 1 of 2 ackgate subscribers",
    )
    assert bus.ops("complete") == [good]


async def test_the_dead_letter_description_names_the_rejecting_subscribers_in_order(
    bus: FakeServiceBus,
) -> None:
    sequence_number = bus.send(
        "q", "{not json", message_id="m-1", application_properties={"kind": "order"}
    )
    async with asyncio.timeout(10):
        raw = await reject_with_reasons("orders", factory(bus))
    assert raw.sequence_number == sequence_number
    client = bus.client()
    dlq = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = await dlq.receive_messages(max_wait_time=0.1)
    await client.close()
    assert (dead.message_id, str(dead), dead.application_properties) == (
        "m-1",
        "{not json",
        {"kind": "order"},
    )
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
        DEAD_LETTER_REASON,
        "rejected by 2 of 3 ackgate subscribers; auditor: schema v3 unsupported; parser: bad json",
    )
    assert dead.dead_letter_error_description.endswith("; ".join(REASONS))
    assert bus.ops("dead_letter") == [sequence_number]
    assert bus.ops("complete") == [] and bus.ops("abandon") == []


async def test_a_failed_event_is_abandoned_and_redelivered(bus: FakeServiceBus) -> None:
    sequence_number = bus.send("q", "m")
    roster = {"crashy", "steady"}
    make = factory(bus)

    async def crash(sub: Subscription, message: Any) -> None:
        raise RuntimeError("handler crashed")

    async def then_end(sub: Subscription, message: Any) -> None:
        if str(message) == "m":
            bus.send("q", "end")

    async def crash_then_retry() -> list[Any]:
        with pytest.raises(RuntimeError):
            await consume(manager.subscribe("o", "crashy", producer=make, roster=roster), 1, crash)
        again = manager.subscribe("o", "crashy", producer=make, roster=roster)
        return await consume(again, 2, then_end)

    async with SharedStreamManager() as manager:
        steady = manager.subscribe("o", "steady", producer=make, roster=roster)
        retried, seen = await asyncio.gather(crash_then_retry(), consume(steady, 2))
    # The copy goes to the handler that crashed alone: "steady" acked the first
    # (docs/concepts.md#redelivery-memory).
    assert [(str(m), m.delivery_count) for m in seen] == [("m", 0), ("end", 0)]
    assert [(str(m), m.delivery_count) for m in retried] == [("m", 1), ("end", 0)]
    assert bus.ops("abandon") == [sequence_number]
    assert bus.ops("complete")[0] == sequence_number


@pytest.mark.parametrize("sessions", [False, True], ids=["lane-per-message", "lane-per-session"])
async def test_lanes_hold_back_a_session_but_not_other_messages(
    bus: FakeServiceBus, sessions: bool
) -> None:
    queue, session_id = ("s", "A") if sessions else ("q", None)
    seqs = [bus.send(queue, f"m{i}", session_id=session_id) for i in range(4)]
    at_last, release = asyncio.Event(), asyncio.Event()
    held: list[int] = []

    async def slow_first(sub: Subscription, message: Any) -> None:
        if str(message) == "m0":
            seq = sub.bind()  # confirmed only later: m0 stays unresolved
            assert seq is not None
            held.append(seq)
        elif str(message) == "m3":
            at_last.set()
            await release.wait()

    async with SharedStreamManager() as manager:
        sub = manager.subscribe(
            "k", "a", producer=factory(bus, queue_name=queue, session_id=session_id)
        )
        task = asyncio.create_task(consume(sub, 4, slow_first))
        async with asyncio.timeout(5):
            await at_last.wait()
            if sessions:  # one lane: m1 and m2 are resolved but wait behind m0
                [stats] = manager.stats()
                assert (stats.lanes, stats.outstanding, bus.ops("complete")) == (1, 4, [])
            else:  # a lane each: m1 and m2 are completed while m0 is still open
                await bus.wait_until(lambda: bus.ops("complete") == seqs[1:3])
            manager.confirm_persisted(held)
            await bus.wait_until(lambda: seqs[0] in bus.ops("complete"))
            release.set()
            await task
    expected = seqs if sessions else [seqs[1], seqs[2], seqs[0], seqs[3]]
    assert bus.ops("complete") == expected


async def test_next_available_sessions_are_read_one_after_another_in_order(
    bus: FakeServiceBus,
) -> None:
    for body in ("a1", "a2", "a3"):
        bus.send("s", body, session_id="A")
    for body in ("b1", "b2"):
        bus.send("s", body, session_id="B")
    make = factory(bus, queue_name="s", session_id=NEXT_AVAILABLE_SESSION)
    async with SharedStreamManager() as manager:
        seen = await consume(manager.subscribe("k", "a", producer=make), 5)
    assert [(m.session_id, str(m)) for m in seen] == [
        ("A", "a1"),
        ("A", "a2"),
        ("A", "a3"),
        ("B", "b1"),
        ("B", "b2"),
    ]
    assert len(bus.entities["s"].completed) == 5 and bus.entities["s"].sessions == {}


async def test_lock_renewal_keeps_a_slow_handlers_message(bus: FakeServiceBus) -> None:
    sequence_number = bus.send("q", "slow")

    async def slow(sub: Subscription, message: Any) -> None:
        await bus.wait_until(lambda: len(bus.ops("renew")) >= 3)  # > 1 s: past the lock

    async with SharedStreamManager() as manager:
        await consume(manager.subscribe("k", "a", producer=factory(bus)), 1, slow)
    assert bus.ops("receive") == [sequence_number]  # never redelivered
    assert bus.ops("expire") == [] and bus.ops("complete") == [sequence_number]


async def test_a_renewal_failure_means_redelivery_not_settlement(
    bus: FakeServiceBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    sequence_number = bus.send("q", "m", message_id="id-42")
    bus.renew_faults.append(ServiceBusError("renewal refused"))

    async with SharedStreamManager() as manager:
        sub = manager.subscribe("k", "a", producer=factory(bus))
        async with asyncio.timeout(10), sub:
            first = await anext(sub)
            await bus.wait_until(lambda: bus.ops("expire") == [sequence_number])
            # The next pull acks the first copy, whose lock is lost: not settled, the
            # broker redelivers. "a" acked an earlier copy, so the redelivered one is
            # completed without being handed to it again (docs/concepts.md#redelivery-memory).
            pulling = asyncio.ensure_future(anext(sub))
            await bus.wait_until(lambda: bus.ops("complete") == [sequence_number])
            assert not pulling.done()
            pulling.cancel()
    assert first.delivery_count == 0
    assert bus.ops("receive") == [sequence_number, sequence_number]
    assert bus.ops("complete") == [sequence_number]  # once: the redelivery, not the lost lock
    assert sub.redeliveries_skipped == 1
    assert f"renewal failed for message_id=id-42 sequence_number={sequence_number}" in caplog.text
    assert "lock was lost; not settling message_id=id-42" in caplog.text


async def test_a_settlement_error_is_logged_and_the_group_carries_on(
    bus: FakeServiceBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    first = bus.send("q", "m0", message_id="id-0")
    second = bus.send("q", "m1")
    bus.settle_faults.append(MessageLockLostError())

    async def until_the_copy_is_completed(sub: Subscription, message: Any) -> None:
        if str(message) == "m1":
            await bus.wait_until(lambda: first in bus.ops("complete"))

    async with SharedStreamManager() as manager:
        sub = manager.subscribe("k", "a", producer=factory(bus))
        seen = await consume(sub, 2, until_the_copy_is_completed)
    # "a" acked m0 already: its redelivered copy is completed without a second
    # handling (docs/concepts.md#redelivery-memory).
    assert [(str(m), m.delivery_count) for m in seen] == [("m0", 0), ("m1", 0)]
    assert sub.redeliveries_skipped == 1
    assert bus.ops("receive") == [first, second, first]
    assert bus.ops("complete") == [first, second]
    assert (
        f"complete failed for message_id=id-0 sequence_number={first} (MessageLockLostError)"
        in caplog.text
    )


async def test_an_unreachable_namespace_ends_the_group_loudly_and_keeps_the_key_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    key = "dGhpcy1pcy10aGUtc2FzLWtleQ=="
    connection_string = (
        "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=root;"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
    )

    def make() -> ServiceBusStreamProducer:
        return ServiceBusStreamProducer(
            connection_string=connection_string,
            queue_name="q",
            max_wait_time=1.0,
            client_options={"retry_total": 0},
        )

    async with SharedStreamManager() as manager:
        sub = manager.subscribe("k", "a", producer=make)
        with pytest.raises(StreamTerminated) as raised:
            await consume(sub, 1)
    assert raised.value.__cause__ is not None
    rendered = "".join(traceback.format_exception(raised.value))
    assert key not in rendered and key not in caplog.text
    assert key not in repr(make())
