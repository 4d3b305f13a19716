"""docs/writing-an-adapter.md#1-the-producer, docs/production.md#service-options and
docs/concepts.md#redelivery-memory against a real SQS server: a suspended producer keeps what it
holds invisible, a redelivered copy goes only to the handler that failed it, and ``to_message``
fills every field the SQS way."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from ackgate import GroupStats, Message, SharedStreamManager, Subscription
from ackgate_sqs import SqsStreamProducer

from .sqs_support import REGION, SqsAdmin

VISIBILITY = 2
SUSPENSION = 8.0  # four visibility timeouts


def factory(sqs: SqsAdmin, url: str, **options: Any) -> Callable[[], SqsStreamProducer]:
    options.setdefault("wait_time_seconds", 1)
    return lambda: SqsStreamProducer(url, region_name=REGION, endpoint_url=sqs.endpoint, **options)


async def test_moto_lets_a_message_reappear_once_its_visibility_timeout_lapses(
    sqs: SqsAdmin,
) -> None:
    # The control for the test below: without a heartbeat the broker does redeliver.
    url = await sqs.create_queue()
    [sent] = await sqs.send(url, ["plain"])
    first = await sqs.client.receive_message(QueueUrl=url, VisibilityTimeout=VISIBILITY)
    assert [m["MessageId"] for m in first["Messages"]] == [sent]
    assert await sqs.drain(url, once=True) == []
    await asyncio.sleep(VISIBILITY + 0.5)
    [again] = await sqs.drain(url, once=True)
    assert again["MessageId"] == sent
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"


async def test_a_group_suspended_for_four_visibility_timeouts_gets_nothing_back(
    sqs: SqsAdmin,
) -> None:
    # overflow="block" and a queue of one: while "stalled" does not pull, the poll
    # waits in a broadcast, open_stream sits at a yield, and eight of the ten
    # messages of its one receive were never yielded yet.
    url = await sqs.create_queue()
    ids = await sqs.send(url, [f"m{i}" for i in range(10)])
    seen: dict[str, Counter[str]] = {"fast": Counter(), "stalled": Counter()}
    counts: list[str] = []
    stolen: list[dict[str, Any]] = []
    received = asyncio.Event()

    async def read(sub: Subscription, name: str, *, stall: bool) -> None:
        async with sub:
            if stall:
                # Once the group received, another consumer polls the queue all
                # along: it must get nothing.
                await received.wait()
                loop = asyncio.get_running_loop()
                until = loop.time() + SUSPENSION
                while loop.time() < until:
                    stolen.extend(await sqs.drain(url, wait=1, once=True))
            async for raw in sub:
                seen[name][raw["MessageId"]] += 1
                received.set()
                counts.append(raw["Attributes"]["ApproximateReceiveCount"])
                if len(seen[name]) == len(ids):
                    return

    make = factory(sqs, url, visibility_timeout=VISIBILITY, max_messages=10)
    async with (
        asyncio.timeout(40),
        SharedStreamManager(
            overflow="block", subscriber_queue_size=1, ack_timeout=60, max_concurrent_advances=10
        ) as manager,
    ):
        fast = manager.subscribe("held", "fast", producer=make)
        stalled = manager.subscribe("held", "stalled", producer=make)
        await asyncio.gather(read(fast, "fast", stall=False), read(stalled, "stalled", stall=True))
    assert stolen == []
    assert all(counter == Counter(ids) for counter in seen.values())  # each handed out once
    assert set(counts) == {"1"}  # and received from SQS once
    assert await sqs.depth(url) == 0  # everything deleted at the end


async def test_a_redelivered_copy_goes_only_to_the_handler_that_failed_it(
    sqs: SqsAdmin,
) -> None:
    # Issue 14. Three declared handlers; "flaky" crashes on m1 while the others ack
    # it: the adapter releases m1, SQS redelivers it, and the copy (same MessageId)
    # is handed to "flaky" alone. Everyone reads until "end", sent once "flaky" has
    # had its second m1.
    url = await sqs.create_queue()
    await sqs.send(url, ["m0", "m1", "m2"])
    roster = {"indexer", "auditor", "flaky"}
    seen: dict[str, list[str]] = {name: [] for name in roster}
    stats: list[GroupStats] = []
    make = factory(sqs, url, visibility_timeout=30, max_messages=1)

    async def read(sub: Subscription, name: str) -> None:
        async with sub:
            async for raw in sub:
                seen[name].append(raw["Body"])
                if raw["Body"] == "end":
                    return
                # A standard queue does not keep order (ElasticMQ hands out m2 before
                # m1 at times): crash on the first m1, wherever it comes.
                if name == "flaky" and raw["Body"] == "m1" and seen[name].count("m1") == 1:
                    raise RuntimeError("flaky handler crashed")
                if name == "flaky" and seen[name].count("m1") == 2 and "m2" in seen[name]:
                    stats.extend(manager.stats())  # every copy was broadcast by now
                    await sqs.send(url, ["end"])

    async def flaky() -> Subscription:
        with pytest.raises(RuntimeError):
            await read(manager.subscribe("svc", "flaky", producer=make, roster=roster), "flaky")
        again = manager.subscribe("svc", "flaky", producer=make, roster=roster)
        await read(again, "flaky")
        return again

    async with asyncio.timeout(40), SharedStreamManager(max_concurrent_advances=10) as manager:
        subs = {
            name: manager.subscribe("svc", name, producer=make, roster=roster)
            for name in ("indexer", "auditor")
        }
        *_, again = await asyncio.gather(
            read(subs["indexer"], "indexer"), read(subs["auditor"], "auditor"), flaky()
        )
    for name in ("indexer", "auditor"):  # each message once; "end" comes last
        assert sorted(seen[name][:-1]) == ["m0", "m1", "m2"] and seen[name][-1] == "end"
    assert seen["flaky"].count("m1") == 2
    # Every redelivered copy was skipped for both handlers that had acked it.
    [group] = stats
    assert group.redeliveries_skipped >= 2
    assert subs["indexer"].redeliveries_skipped == subs["auditor"].redeliveries_skipped
    assert subs["indexer"].redeliveries_skipped * 2 == group.redeliveries_skipped
    assert again.redeliveries_skipped == 0
    assert await sqs.depth(url) == 0  # the copies were advanced clean: deleted


async def test_to_message_fills_body_key_headers_id_lane_and_attempt(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue(fifo=True)
    binary = b"\x00\xffbin"
    attributes = {
        "trace": {"DataType": "String", "StringValue": "t-1"},
        "count": {"DataType": "Number", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": binary},
        "kind": {"DataType": "String.custom", "StringValue": "x"},
    }
    [sent] = await sqs.send(url, ["héllo"], group="g-1", attributes=attributes)
    source = factory(sqs, url)()
    stream = source.open_stream()
    try:
        raw, payload = await anext(stream)
        message = source.to_message(raw, payload)
        assert isinstance(message, Message)
        assert message.body == "héllo".encode()
        assert message.key == b"g-1"
        assert dict(message.headers) == {
            "trace": b"t-1",
            "count": b"42",
            "blob": binary,
            "kind": b"x",
        }
        assert message.id == sent == source.get_event_id(payload)
        assert message.lane == source.get_advance_lane(payload) == "g-1"
        assert message.attempt == 1
        assert message.raw is raw
    finally:
        await stream.aclose()
        await source.aclose()  # releases it: SQS hands it out again
    [again] = await sqs.drain(url, wait=1, once=True)
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"


async def test_to_message_on_a_standard_queue_has_no_key(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue()
    [sent] = await sqs.send(url, ["plain"])
    source = factory(sqs, url)()
    stream = source.open_stream()
    try:
        raw, payload = await anext(stream)
        message = source.to_message(raw, payload)
    finally:
        await stream.aclose()
        await source.aclose()
    assert (message.key, dict(message.headers), message.id, message.lane) == (None, {}, sent, sent)
