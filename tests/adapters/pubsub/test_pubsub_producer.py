"""The producer on its own against the emulator, driven the way ackgate drives it,
plus its argument checks and exactly-once per-ack-id handling (no broker needed)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.api_core.exceptions import InvalidArgument, ServiceUnavailable
from google.rpc.error_details_pb2 import ErrorInfo

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate_pubsub import PubSubError, PubSubStreamProducer

from .pubsub_support import PubSubAdmin, text

ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)
FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)
SUBSCRIPTION = "projects/p/subscriptions/s"


async def take(stream: Any, count: int) -> list[Any]:
    async with asyncio.timeout(15):
        return [(await anext(stream))[1] for _ in range(count)]


async def test_acked_messages_are_acknowledged_and_failed_ones_come_back(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    await pubsub.publish(topic, ["a", "b", "c"])
    producer = PubSubStreamProducer(subscription, ack_deadline=60)
    stream: Any = producer.open_stream()
    try:
        payloads = await take(stream, 3)
        assert sorted(text(p) for p in payloads) == ["a", "b", "c"]
        by_body = {text(p): p for p in payloads}
        await producer.advance([AdvanceItem(by_body["a"], ACKED)])
        await producer.advance([AdvanceItem(by_body["b"], FAILED)])
        # Nacked, so it is back long before the 60 s lease would have run out.
        (again,) = await take(stream, 1)
        assert text(again) == "b"
        await producer.advance([AdvanceItem(again, ACKED)])
    finally:
        await stream.aclose()
        await producer.aclose()
    # "c" was never advanced: aclose nacked it, so it is back at once; "a", "b" are gone.
    returned = await pubsub.pull(subscription, wait=5)
    assert [text(r) for r in returned] == ["c"]
    await pubsub.ack(subscription, returned)
    assert await pubsub.pull(subscription, wait=2) == []


async def test_lanes_are_ordering_keys_or_single_messages(pubsub: PubSubAdmin) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic, ordering=True)
    await pubsub.publish(topic, ["k1", "k2"], ordering_key="key")
    await pubsub.publish(topic, ["x", "y"])
    producer = PubSubStreamProducer(subscription)
    stream: Any = producer.open_stream()
    try:
        payloads = {text(p): p for p in await take(stream, 4)}
        lanes = {body: producer.get_advance_lane(p) for body, p in payloads.items()}
        assert lanes["k1"] == lanes["k2"] == "key"
        assert len({lanes["x"], lanes["y"], "key"}) == 3
        for payload in payloads.values():
            await producer.advance([AdvanceItem(payload, ACKED)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert await pubsub.pull(subscription, wait=2) == []


async def test_a_failed_pull_ends_the_stream_loudly(pubsub: PubSubAdmin) -> None:
    producer = PubSubStreamProducer("projects/ackgate-test/subscriptions/does-not-exist")
    stream: Any = producer.open_stream()
    try:
        with pytest.raises(PubSubError, match="pull from"):
            async with asyncio.timeout(15):
                await anext(stream)
    finally:
        await producer.aclose()


class CountingProducer(PubSubStreamProducer):
    """Records every lease call (receipt and extensions) with its ack ids."""

    def __init__(self, subscription: str, **options: Any) -> None:
        super().__init__(subscription, **options)
        self.lease_calls: list[list[str]] = []
        self.extended = asyncio.Event()

    async def _modify(self, ack_ids: list[str]) -> None:
        self.lease_calls.append(list(ack_ids))
        if len(self.lease_calls) > 1:
            self.extended.set()
        await super()._modify(ack_ids)


async def test_leases_are_extended_in_one_call_and_stop_once_advanced(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    await pubsub.publish(topic, [f"m{n}" for n in range(30)])
    producer = CountingProducer(subscription, ack_deadline=10)
    stream: Any = producer.open_stream()
    try:
        payloads = await take(stream, 30)
        for payload in payloads[:10]:
            await producer.advance([AdvanceItem(payload, ACKED)])
        async with asyncio.timeout(10):
            await producer.extended.wait()  # due once less than half of 10 s is left
        receipt, extension = producer.lease_calls[:2]
        assert sorted(receipt) == sorted(p.ack_id for p in payloads)
        assert sorted(extension) == sorted(p.ack_id for p in payloads[10:])
        for payload in payloads[10:]:
            await producer.advance([AdvanceItem(payload, ACKED)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert await pubsub.pull(subscription, wait=2) == []


class FailingAckProducer(PubSubStreamProducer):
    def __init__(self, subscription: str, **options: Any) -> None:
        super().__init__(subscription, **options)
        self.ack_failed = asyncio.Event()

    async def _acknowledge(self, ack_ids: list[str]) -> None:
        self.ack_failed.set()
        raise ServiceUnavailable("acknowledge is down")


async def test_a_failed_ack_ends_the_group_at_the_next_advance_and_nothing_is_lost(
    pubsub: PubSubAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    await pubsub.publish(topic, ["a", "b", "c"])
    producer = FailingAckProducer(subscription, ack_deadline=60, max_outstanding=2)
    stream: Any = producer.open_stream()
    try:
        first, second = await take(stream, 2)
        await producer.advance([AdvanceItem(first, ACKED)])  # queued, sent in the background
        async with asyncio.timeout(10):
            await producer.ack_failed.wait()
        with pytest.raises(PubSubError, match="acknowledge") as raised:
            await producer.advance([AdvanceItem(second, FAILED)])
        assert isinstance(raised.value.__cause__, ServiceUnavailable)
        # The poll, out of room while nothing gets settled, ends loudly too.
        with pytest.raises(PubSubError, match="acknowledge"):
            async with asyncio.timeout(10):
                await anext(stream)
    finally:
        await stream.aclose()
        await producer.aclose()
    assert "they will be redelivered" in caplog.text
    # "a" and "b" were still leased at close, so they were nacked and are back at once.
    back = await pubsub.pull(subscription, wait=5)
    assert sorted(text(r) for r in back) == ["a", "b", "c"]
    await pubsub.ack(subscription, back)


async def test_a_failed_dead_letter_publish_raises_and_keeps_the_message(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    await pubsub.publish(topic, ["poison"])
    missing_topic = "projects/ackgate-test/topics/never-created"
    producer = PubSubStreamProducer(subscription, ack_deadline=60, dlq_topic=missing_topic)
    stream: Any = producer.open_stream()
    try:
        (poison,) = await take(stream, 1)
        rejected = AdvanceOutcome(acked=0, failed=0, rejected=1)
        with pytest.raises(PubSubError, match="publish to"):
            await producer.advance([AdvanceItem(poison, rejected)])
    finally:
        await stream.aclose()
        await producer.aclose()
    (back,) = await pubsub.pull(subscription, wait=5)
    assert text(back) == "poison"
    await pubsub.ack(subscription, [back])


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("max_messages", 0),
        ("max_messages", 1001),
        ("ack_deadline", 9),
        ("ack_deadline", 601),
        ("max_outstanding", 1),
        ("pull_timeout", 0),
        ("dlq_topic", "not-a-topic"),
    ],
)
def test_arguments_are_checked_at_once(argument: str, value: Any) -> None:
    with pytest.raises(ValueError, match=argument):
        PubSubStreamProducer(SUBSCRIPTION, **{argument: value})


def test_a_bare_subscription_name_is_refused() -> None:
    with pytest.raises(ValueError, match="subscription"):
        PubSubStreamProducer("my-subscription")


def _exactly_once_refusal(failures: dict[str, str]) -> InvalidArgument:
    info = ErrorInfo(reason="EXACTLY_ONCE_ACKID_FAILURE", metadata=failures)
    return InvalidArgument("some ack ids failed", error_info=info)


async def test_exactly_once_failures_retry_transient_and_report_permanent_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = PubSubStreamProducer(SUBSCRIPTION)
    calls: list[list[str]] = []

    async def acknowledge(ack_ids: list[str]) -> None:
        calls.append(list(ack_ids))
        if len(calls) == 1:
            raise _exactly_once_refusal(
                {"gone": "PERMANENT_FAILURE_INVALID_ACK_ID", "busy": "TRANSIENT_FAILURE_UNORDERED"}
            )

    refused = await producer._settle("acknowledge", acknowledge, ["ok", "gone", "busy"])
    assert refused == {"gone": "PERMANENT_FAILURE_INVALID_ACK_ID"}
    assert calls == [["ok", "gone", "busy"], ["busy"]]  # only the transient one is retried


async def test_an_error_without_per_ack_detail_is_raised() -> None:
    producer = PubSubStreamProducer(SUBSCRIPTION)

    async def acknowledge(ack_ids: list[str]) -> None:
        raise InvalidArgument("bad request")

    with pytest.raises(PubSubError, match="acknowledge") as raised:
        await producer._settle("acknowledge", acknowledge, ["a"])
    assert isinstance(raised.value.__cause__, InvalidArgument)
