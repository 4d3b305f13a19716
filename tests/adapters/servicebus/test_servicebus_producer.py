"""ServiceBusStreamProducer driven directly (open_stream / advance / aclose) against the fake.

Lock timings here are real but short: a 1 s lock, renewed once under 0.6 s are left.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION as SDK_NEXT_AVAILABLE
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    ServiceBusError,
    SessionLockLostError,
)

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate_servicebus import (
    DEAD_LETTER_REASON,
    NEXT_AVAILABLE_SESSION,
    ServiceBusStreamProducer,
)
from ackgate_servicebus._locks import RENEWALS_IN_FLIGHT

from .fake_servicebus import FakeServiceBus

CLEAN = AdvanceOutcome(acked=2, failed=0, rejected=0)
REJECTED = AdvanceOutcome(acked=1, failed=0, rejected=1)
FAILED = AdvanceOutcome(acked=1, failed=1, rejected=0)
FAILED_AND_REJECTED = AdvanceOutcome(acked=0, failed=1, rejected=1)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)

KEY = "c2VjcmV0LXNhcy1rZXktdmFsdWU9PQ=="
CONNECTION_STRING = (
    f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey={KEY}"
)
LOGGER = "ackgate.adapters.servicebus"


@pytest.fixture
def bus() -> FakeServiceBus:
    bus = FakeServiceBus(lock_duration=1.0, max_delivery_count=5)
    bus.create_queue("q")
    bus.create_queue("s", requires_session=True)
    return bus


def producer(bus: FakeServiceBus, **options: Any) -> ServiceBusStreamProducer:
    options.setdefault("queue_name", "q")
    return ServiceBusStreamProducer(
        client_factory=bus.client, max_wait_time=0.05, lock_renewal_margin=0.6, **options
    )


def open_stream(p: ServiceBusStreamProducer) -> AsyncGenerator[tuple[Any, Any], None]:
    stream = p.open_stream()
    assert isinstance(stream, AsyncGenerator)
    return stream


async def pull(stream: AsyncIterator[tuple[Any, Any]], count: int) -> list[tuple[Any, Any]]:
    async with asyncio.timeout(5):
        return [await anext(stream) for _ in range(count)]


async def test_outcomes_map_to_complete_dead_letter_and_abandon(bus: FakeServiceBus) -> None:
    for body in ("clean", "rejected", "failed", "nobody", "both"):
        bus.send("q", body)
    p = producer(bus)
    stream = open_stream(p)
    events = await pull(stream, 5)
    for (_, payload), outcome in zip(
        events, (CLEAN, REJECTED, FAILED, NOBODY, FAILED_AND_REJECTED), strict=True
    ):
        await p.advance([AdvanceItem(payload, outcome)])
    entity = bus.entities["q"]
    assert [m.body for m in entity.completed] == [b"clean"]
    [dead] = entity.dead_lettered
    assert (dead.body, dead.dead_letter_reason) == (b"rejected", DEAD_LETTER_REASON)
    assert dead.dead_letter_error_description == "rejected by 1 of 2 ackgate subscribers"
    redelivered = await pull(stream, 3)
    assert [(str(m), m.delivery_count) for m, _ in redelivered] == [
        ("failed", 1),
        ("nobody", 1),
        ("both", 1),
    ]
    await stream.aclose()
    await p.aclose()


async def test_lane_is_the_sequence_number_without_sessions(bus: FakeServiceBus) -> None:
    sequence_numbers = [bus.send("q", str(i)) for i in range(3)]
    p = producer(bus)
    stream = open_stream(p)
    lanes = [p.get_advance_lane(payload) for _, payload in await pull(stream, 3)]
    assert lanes == sequence_numbers
    await stream.aclose()
    await p.aclose()


async def test_lane_is_the_session_id_on_session_entities(bus: FakeServiceBus) -> None:
    for body in ("1", "2", "3"):
        bus.send("s", body, session_id="A")
    p = producer(bus, queue_name="s", session_id="A")
    stream = open_stream(p)
    events = await pull(stream, 3)
    assert [(str(m), p.get_advance_lane(payload)) for m, payload in events] == [
        ("1", "A"),
        ("2", "A"),
        ("3", "A"),
    ]
    await p.advance([AdvanceItem(payload, CLEAN) for _, payload in events])
    assert [m.body for m in bus.entities["s"].completed] == [b"1", b"2", b"3"]
    await stream.aclose()
    await p.aclose()


@pytest.mark.parametrize("next_available", [NEXT_AVAILABLE_SESSION, SDK_NEXT_AVAILABLE])
async def test_next_available_session_moves_on_once_a_session_is_done(
    bus: FakeServiceBus, next_available: Any
) -> None:
    bus.send("s", "a1", session_id="A")
    bus.send("s", "a2", session_id="A")
    bus.send("s", "b1", session_id="B")
    p = producer(bus, queue_name="s", session_id=next_available)
    stream = open_stream(p)
    first = await pull(stream, 2)
    assert [(str(m), p.get_advance_lane(d)) for m, d in first] == [("a1", "A"), ("a2", "A")]
    await p.advance([AdvanceItem(d, CLEAN) for _, d in first])
    [(b1, payload)] = await pull(stream, 1)
    assert (str(b1), p.get_advance_lane(payload)) == ("b1", "B")
    await p.advance([AdvanceItem(payload, CLEAN)])
    assert [m.body for m in bus.entities["s"].completed] == [b"a1", b"a2", b"b1"]
    await stream.aclose()
    await p.aclose()


async def test_next_available_session_waits_out_an_empty_entity(bus: FakeServiceBus) -> None:
    p = producer(bus, queue_name="s", session_id=NEXT_AVAILABLE_SESSION)
    stream = open_stream(p)
    first = asyncio.ensure_future(pull(stream, 1))
    async with asyncio.timeout(5):  # several "no session available" timeouts go by
        await bus.wait_until(lambda: sum(len(c.receivers) for c in bus.clients) >= 3)
    assert not first.done()
    bus.send("s", "late", session_id="Z")
    [(message, payload)] = await first
    assert (str(message), p.get_advance_lane(payload)) == ("late", "Z")
    await stream.aclose()
    await p.aclose()


async def test_a_topic_subscription_is_read_and_settled(bus: FakeServiceBus) -> None:
    bus.create_subscription("orders", "ours")
    bus.create_subscription("orders", "theirs")
    bus.send("orders", "o1")
    p = producer(bus, queue_name=None, topic_name="orders", subscription_name="ours")
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)
    await p.advance([AdvanceItem(payload, CLEAN)])
    assert [m.body for m in bus.entities["orders/subscriptions/ours"].completed] == [b"o1"]
    assert bus.entities["orders/subscriptions/theirs"].active_count() == 1
    await stream.aclose()
    await p.aclose()


async def test_lock_renewal_keeps_a_slow_message(bus: FakeServiceBus) -> None:
    sequence_number = bus.send("q", "slow")
    p = producer(bus)
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)
    async with asyncio.timeout(5):  # three renewals: well past the 1 s lock
        await bus.wait_until(lambda: len(bus.ops("renew")) >= 3)
    await p.advance([AdvanceItem(payload, CLEAN)])
    assert bus.ops("complete") == [sequence_number]
    assert bus.ops("expire") == [] and bus.ops("receive") == [sequence_number]
    await stream.aclose()
    await p.aclose()


async def test_hundreds_of_held_locks_are_renewed_concurrently_before_they_lapse() -> None:
    # 200 messages locked at once for 2 s, each renewal 20 ms on the wire, renewed once
    # under 1.2 s are left: one after another a pass takes 4 s and most locks lapse
    # before their turn; RENEWALS_IN_FLIGHT at a time it takes 7 round trips (0.14 s).
    bus = FakeServiceBus(lock_duration=2.0, renew_delay=0.02)
    bus.create_queue("q")
    sent = [bus.send("q", f"m{i}") for i in range(200)]
    p = ServiceBusStreamProducer(
        client_factory=bus.client,
        queue_name="q",
        max_message_count=len(sent),
        max_wait_time=0.05,
        lock_renewal_margin=1.2,
    )
    stream = open_stream(p)
    events = await pull(stream, len(sent))
    assert bus.ops("receive") == sent  # one receive: every lock runs from the same moment

    def renewed_twice_or_lapsed() -> bool:
        renewals = Counter(bus.ops("renew"))
        return bool(bus.ops("expire")) or all(renewals[n] >= 2 for n in sent)

    async with asyncio.timeout(10):  # two renewals each: held past the first lock's end
        await bus.wait_until(renewed_twice_or_lapsed)
    assert bus.ops("expire") == []
    assert bus.max_renewals_in_flight == RENEWALS_IN_FLIGHT
    await p.advance([AdvanceItem(payload, CLEAN) for _, payload in events])
    assert sorted(bus.ops("complete")) == sent
    await stream.aclose()
    await p.aclose()


async def test_renewal_failure_leaves_the_message_to_redelivery(
    bus: FakeServiceBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    sequence_number = bus.send("q", "unlucky", message_id="msg-7")
    bus.renew_faults.append(ServiceBusError("renewal refused"))
    p = producer(bus)
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)
    async with asyncio.timeout(5):
        await bus.wait_until(lambda: bus.ops("expire") == [sequence_number])
    assert "renewal failed for message_id=msg-7 sequence_number=" in caplog.text
    await p.advance([AdvanceItem(payload, CLEAN)])  # acked, but the lock is gone
    assert bus.ops("complete") == []
    [(again, payload)] = await pull(stream, 1)
    assert (again.message_id, again.delivery_count) == ("msg-7", 1)
    await p.advance([AdvanceItem(payload, CLEAN)])
    assert bus.ops("complete") == [sequence_number]
    await stream.aclose()
    await p.aclose()


@pytest.mark.parametrize(
    "error",
    [
        MessageLockLostError(),
        MessageAlreadySettled(action="complete"),
        SessionLockLostError(),
        ServiceBusError("transport trouble"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_settlement_errors_are_logged_not_raised(
    bus: FakeServiceBus, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    sequence_number = bus.send("q", "x", message_id="msg-1")
    bus.settle_faults.append(error)
    p = producer(bus)
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)
    await p.advance([AdvanceItem(payload, CLEAN)])
    assert (
        f"complete failed for message_id=msg-1 sequence_number={sequence_number} "
        f"({type(error).__name__})" in caplog.text
    )
    assert bus.ops("complete") == []
    await stream.aclose()
    await p.aclose()


async def test_an_unexpected_settlement_error_raises(bus: FakeServiceBus) -> None:
    bus.send("q", "x")
    bus.settle_faults.append(RuntimeError("a bug, not a broker refusal"))
    p = producer(bus)
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)
    with pytest.raises(RuntimeError, match="a bug"):
        await p.advance([AdvanceItem(payload, CLEAN)])
    await stream.aclose()
    await p.aclose()


async def test_session_lock_loss_ends_the_stream_and_settles_nothing(
    bus: FakeServiceBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    bus.send("s", "1", session_id="A")
    bus.renew_faults.append(SessionLockLostError())
    p = producer(bus, queue_name="s", session_id="A")
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)
    with pytest.raises(SessionLockLostError):
        await pull(stream, 1)
    assert "session lock renewal failed for session_id=A" in caplog.text
    await p.advance([AdvanceItem(payload, CLEAN)])
    assert bus.ops("complete") == []
    await p.aclose()


async def test_aclose_abandons_what_was_not_advanced_and_closes(bus: FakeServiceBus) -> None:
    for body in ("a", "b", "c"):
        bus.send("q", body)
    p = producer(bus)
    stream = open_stream(p)
    [(_, payload)] = await pull(stream, 1)  # one receive took all three
    await p.advance([AdvanceItem(payload, CLEAN)])
    await stream.aclose()
    assert bus.clients[0].closed is False  # the generator's finally keeps the client
    await p.aclose()
    assert sorted(bus.ops("abandon")) == [2, 3]
    assert [(m.body, m.delivery_count) for m in bus.entities["q"].messages] == [
        (b"b", 1),
        (b"c", 1),
    ]
    assert bus.clients[0].closed and all(r.closed for r in bus.clients[0].receivers)


@pytest.mark.parametrize(
    "options",
    [
        {"queue_name": "q"},
        {"connection_string": CONNECTION_STRING, "client_factory": object, "queue_name": "q"},
        {"connection_string": CONNECTION_STRING, "credential": KEY, "queue_name": "q"},
        {"fully_qualified_namespace": "ns.servicebus.windows.net", "queue_name": "q"},
        {"connection_string": f"SharedAccessKey={KEY}", "queue_name": "q"},
        {"connection_string": CONNECTION_STRING},
        {"connection_string": CONNECTION_STRING, "topic_name": "t"},
        {"connection_string": CONNECTION_STRING, "queue_name": "q", "topic_name": "t"},
        {"connection_string": CONNECTION_STRING, "queue_name": "q", "session_id": ""},
        {"connection_string": CONNECTION_STRING, "queue_name": "q", "max_message_count": 0},
        {"connection_string": CONNECTION_STRING, "queue_name": "q", "prefetch_count": -1},
        {"connection_string": CONNECTION_STRING, "queue_name": "q", "max_wait_time": 0},
        {"connection_string": CONNECTION_STRING, "queue_name": "q", "lock_renewal_margin": 0},
    ],
)
def test_bad_arguments_raise_without_echoing_secrets(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as raised:
        ServiceBusStreamProducer(**options)
    assert KEY not in str(raised.value) and KEY not in repr(raised.value)


def test_repr_shows_the_namespace_never_the_key() -> None:
    p = ServiceBusStreamProducer(
        connection_string=CONNECTION_STRING, topic_name="t", subscription_name="sub"
    )
    assert repr(p) == (
        "ServiceBusStreamProducer(namespace='ns.servicebus.windows.net', "
        "topic 't' subscription 'sub')"
    )
    q = ServiceBusStreamProducer(
        fully_qualified_namespace="ns.servicebus.windows.net",
        credential=KEY,
        queue_name="q",
        session_id="A",
    )
    assert KEY not in repr(q) and "session='A'" in repr(q)


async def test_sdk_client_errors_do_not_echo_the_connection_string() -> None:
    broken = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey={KEY}"
    stream = open_stream(ServiceBusStreamProducer(connection_string=broken, queue_name="q"))
    with pytest.raises(ValueError) as raised:
        await anext(stream)
    text = f"{raised.value!r} {raised.value.__cause__!r} {raised.value.__context__!r}"
    assert KEY not in text
