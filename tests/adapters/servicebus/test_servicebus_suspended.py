"""docs/writing-an-adapter.md#1-the-producer, docs/production.md#service-options and
docs/concepts.md#redelivery-memory against the fake Service Bus: a suspended producer keeps its
locks, a message whose lock lapsed before it was received is not handed out, a redelivered copy goes
only to the handler that failed it, and ``to_message`` fills every field the Service Bus way.

Locks are real-time and short (1 s, renewed when under 0.6 s remain); the fake expires
a lock on the first broker call after its time is up, and the tests make such calls
all along.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from ackgate import GroupStats, SharedStreamManager, Subscription
from ackgate_servicebus import ServiceBusStreamProducer

from .fake_servicebus import FakeReceiver, FakeServiceBus

LOCK = 1.0
SUSPENSION = 4.0  # four lock durations


@pytest.fixture
def bus() -> FakeServiceBus:
    bus = FakeServiceBus(lock_duration=LOCK, max_delivery_count=5)
    bus.create_queue("q")
    bus.create_queue("s", requires_session=True)
    return bus


def factory(
    bus: FakeServiceBus, client: Callable[[], Any] | None = None, **options: Any
) -> Callable[[], ServiceBusStreamProducer]:
    options.setdefault("queue_name", "q")
    return lambda: ServiceBusStreamProducer(
        client_factory=client or bus.client,
        max_wait_time=0.05,
        lock_renewal_margin=0.6,
        **options,
    )


@pytest.mark.parametrize("session", [None, "a"], ids=["message-locks", "session-lock"])
async def test_a_group_suspended_for_four_lock_durations_gets_nothing_back(
    bus: FakeServiceBus, session: str | None
) -> None:
    # overflow="block" and a queue of one: while "stalled" does not pull, the poll
    # waits in a broadcast and open_stream sits at a yield, eight of the ten
    # messages of its one receive not yielded yet.
    entity = "s" if session else "q"
    sent = [bus.send(entity, f"m{i}", session_id=session) for i in range(10)]
    seen: dict[str, Counter[int]] = {"fast": Counter(), "stalled": Counter()}
    received = asyncio.Event()

    async def read(sub: Subscription, name: str, *, stall: bool) -> None:
        async with sub:
            if stall:
                await received.wait()
                loop = asyncio.get_running_loop()
                until = loop.time() + SUSPENSION
                while loop.time() < until:
                    bus.expire_locks()  # the broker looks at its locks all along
                    await asyncio.sleep(0.05)
            async for message in sub:
                seen[name][message.sequence_number] += 1
                received.set()
                if len(seen[name]) == len(sent):
                    return

    make = factory(bus, queue_name=entity, session_id=session, max_message_count=10)
    async with (
        asyncio.timeout(20),
        SharedStreamManager(overflow="block", subscriber_queue_size=1, ack_timeout=60) as manager,
    ):
        fast = manager.subscribe("held", "fast", producer=make)
        stalled = manager.subscribe("held", "stalled", producer=make)
        await asyncio.gather(read(fast, "fast", stall=False), read(stalled, "stalled", stall=True))
    assert bus.ops("expire") == []
    assert all(counter == Counter(sent) for counter in seen.values())  # handed out once
    assert bus.ops("receive") == sent  # received from the broker once
    assert sorted(bus.ops("complete")) == sent
    renewals = bus.ops("renew_session" if session else "renew")
    assert len(renewals) >= len(sent if not session else [session]) * 3


async def test_a_message_whose_lock_lapsed_before_it_was_received_is_not_handed_out(
    bus: FakeServiceBus,
) -> None:
    # As with prefetch: the first receive's messages sit (in the SDK's buffer) past
    # their lock before the adapter gets them. They must not be handed out on a lost
    # lock; the broker's redelivery is.
    sent = [bus.send("q", f"m{i}") for i in range(3)]
    delays = [LOCK + 0.3]

    def client() -> Any:
        real = bus.client()
        get_receiver = real.get_queue_receiver

        def delayed_receiver(*args: Any, **options: Any) -> FakeReceiver:
            receiver = get_receiver(*args, **options)
            receive = receiver.receive_messages

            async def late(**kwargs: Any) -> Any:
                messages = await receive(**kwargs)
                if messages and delays:
                    await asyncio.sleep(delays.pop())
                return messages

            receiver.receive_messages = late  # type: ignore[method-assign]
            return receiver

        real.get_queue_receiver = delayed_receiver
        return real

    got: list[tuple[int, int]] = []
    async with asyncio.timeout(10), SharedStreamManager() as manager:
        producer = factory(bus, client, max_message_count=10)()
        async with manager.subscribe("k", "only", producer=lambda: producer) as sub:
            async for message in sub:
                got.append((message.sequence_number, message.delivery_count))
                if len(got) == len(sent):
                    break
    assert got == [(n, 1) for n in sent]  # each handed out once: its second delivery
    assert bus.ops("receive") == sent + sent
    assert sorted(bus.ops("complete")) == sent


async def test_a_redelivered_copy_goes_only_to_the_handler_that_failed_it(
    bus: FakeServiceBus,
) -> None:
    # Issue 14. Three declared handlers; "flaky" crashes on m1 while the others ack
    # it: the adapter abandons it, the broker redelivers it, and the copy (same
    # sequence number) is handed to "flaky" alone. Everyone reads until "end", sent
    # once "flaky" had its copy.
    first = [bus.send("q", body) for body in ("m0", "m1", "m2")]
    roster = {"indexer", "auditor", "flaky"}
    seen: dict[str, list[str]] = {name: [] for name in roster}
    stats: list[GroupStats] = []
    make = factory(bus, max_message_count=1)

    async def read(sub: Subscription, name: str) -> None:
        async with sub:
            async for message in sub:
                seen[name].append(str(message))
                if str(message) == "end":
                    return
                if name == "flaky" and seen[name] == ["m0", "m1"]:
                    raise RuntimeError("flaky handler crashed")
                if name == "flaky" and seen[name].count("m1") == 2 and "m2" in seen[name]:
                    stats.extend(manager.stats())  # every copy was broadcast by now
                    bus.send("q", "end")

    async def flaky() -> Subscription:
        with pytest.raises(RuntimeError):
            await read(manager.subscribe("svc", "flaky", producer=make, roster=roster), "flaky")
        again = manager.subscribe("svc", "flaky", producer=make, roster=roster)
        await read(again, "flaky")
        return again

    async with asyncio.timeout(20), SharedStreamManager() as manager:
        subs = {
            name: manager.subscribe("svc", name, producer=make, roster=roster)
            for name in ("indexer", "auditor")
        }
        *_, again = await asyncio.gather(
            read(subs["indexer"], "indexer"), read(subs["auditor"], "auditor"), flaky()
        )
    assert seen["indexer"] == seen["auditor"] == ["m0", "m1", "m2", "end"]
    assert seen["flaky"].count("m1") == 2
    [group] = stats
    assert group.redeliveries_skipped >= 2
    assert subs["indexer"].redeliveries_skipped == subs["auditor"].redeliveries_skipped
    assert subs["indexer"].redeliveries_skipped * 2 == group.redeliveries_skipped
    assert again.redeliveries_skipped == 0
    assert bus.ops("abandon")[0] == first[1]
    assert set(bus.ops("complete")) == {*first, max(bus.ops("complete"))}  # and "end"
    assert bus.entities["q"].active_count() == 0


@pytest.mark.parametrize("session", [None, "order-7"])
async def test_to_message_fills_body_key_headers_id_lane_and_attempt(
    bus: FakeServiceBus, session: str | None
) -> None:
    entity = "s" if session else "q"
    properties = {b"trace": b"t-1", "kind": "x", "count": 42}
    sequence_number = bus.send(
        entity, "héllo", session_id=session, message_id="mid-1", application_properties=properties
    )
    source = factory(bus, queue_name=entity, session_id=session)()
    stream = source.open_stream()
    try:
        raw, payload = await anext(stream)
        message = source.to_message(raw, payload)
    finally:
        await stream.aclose()
        await source.aclose()
    assert message.body == "héllo".encode()
    assert message.key == (None if session is None else session.encode())
    assert dict(message.headers) == {"trace": b"t-1", "kind": b"x", "count": b"42"}
    assert message.id == "mid-1"
    assert source.get_event_id(payload) == sequence_number
    assert message.lane == source.get_advance_lane(payload)
    assert message.lane == (sequence_number if session is None else session)
    assert message.attempt == 1  # the SDK's delivery_count is 0 on a first delivery
    assert message.raw is raw
