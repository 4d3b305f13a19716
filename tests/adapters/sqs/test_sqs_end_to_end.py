"""SharedStreamManager over SqsStreamProducer against a real SQS server."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ackgate import SharedStreamManager, Subscription, reject_shared_stream_event
from ackgate_sqs import REASON_ATTRIBUTE, SqsStreamProducer
from ackgate_test_support.reject_reasons import REASONS, reject_with_reasons

from .sqs_support import REGION, SqsAdmin


def factory(sqs: SqsAdmin, url: str, **options: Any) -> Callable[[], SqsStreamProducer]:
    # A short long poll keeps group shutdown quick: closing waits for a poll in flight.
    options.setdefault("wait_time_seconds", 1)
    return lambda: SqsStreamProducer(url, region_name=REGION, endpoint_url=sqs.endpoint, **options)


async def test_standard_queue_fans_1000_messages_out_to_4_subscribers(sqs: SqsAdmin) -> None:
    # 1000 is twenty backlogs, enough for every subscriber to run behind and catch up
    # many times. Bigger, by hand: benchmarks/sqs_throughput.py --messages 5000.
    url = await sqs.create_queue()
    total, backlog = 1000, 50
    ids: set[str] = set()
    seen: list[Counter[str]] = [Counter() for _ in range(4)]
    progress = asyncio.Event()

    async def feed() -> None:
        # moto scans the whole queue on every send and receive, so a deep backlog
        # makes it quadratic; keep at most `backlog` messages ahead of the slowest.
        for start in range(0, total, 10):
            while start - min(map(len, seen)) >= backlog:
                progress.clear()
                await progress.wait()
            ids.update(await sqs.send(url, [f"m{i}" for i in range(start, start + 10)]))

    async def consume(sub: Subscription, counts: Counter[str]) -> None:
        async with sub:
            async for raw in sub:
                counts[raw["MessageId"]] += 1
                progress.set()
                if len(counts) == total:
                    return

    async with asyncio.timeout(180), SharedStreamManager(max_concurrent_advances=10) as manager:
        # Subscribed in one step, so all four are in the first event's snapshot.
        make = factory(sqs, url)
        subs = [manager.subscribe("orders", f"s{i}", producer=make) for i in range(4)]
        await asyncio.gather(feed(), *(consume(sub, c) for sub, c in zip(subs, seen, strict=True)))
    assert len(ids) == total
    assert all(set(counts) == ids for counts in seen)
    assert await sqs.depth(url) == 0


async def test_fifo_keeps_group_order_and_a_blocked_group_stalls_no_other(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue(fifo=True)
    groups = ["slow", "a", "b", "c"]
    per_group = 25
    for group in groups:  # "slow" first: its messages fill the first receive
        await sqs.send(url, [f"{group}:{i}" for i in range(per_group)], group=group)
    total = len(groups) * per_group
    seen: dict[str, list[list[int]]] = {name: [[] for _ in groups] for name in ("x", "y")}
    held: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    others_done = asyncio.Event()
    slow_seen_while_held: list[int] = []

    def record(name: str, raw: dict[str, Any]) -> None:
        group, index = raw["Body"].split(":")
        assert raw["Attributes"]["MessageGroupId"] == group
        seen[name][groups.index(group)].append(int(index))
        if all(len(per[g]) == per_group for per in seen.values() for g in (1, 2, 3)):
            others_done.set()

    async def consume(sub: Subscription, name: str) -> None:
        async with sub:
            async for raw in sub:
                record(name, raw)
                if name == "x" and raw["Body"] == "slow:0":
                    # An output of slow:0 not yet stored: the "slow" lane cannot advance.
                    seq = sub.bind()
                    assert seq is not None
                    held.set_result(seq)
                if sum(map(len, seen[name])) == total:
                    return

    async with asyncio.timeout(60), SharedStreamManager() as manager:
        factory_ = factory(sqs, url)
        x = asyncio.create_task(consume(manager.subscribe("fifo", "x", producer=factory_), "x"))
        y = asyncio.create_task(consume(manager.subscribe("fifo", "y", producer=factory_), "y"))
        seq = await held
        await others_done.wait()
        slow_seen_while_held.extend(len(seen[name][0]) for name in ("x", "y"))
        manager.confirm_persisted([seq])
        await asyncio.gather(x, y)
    assert max(slow_seen_while_held) < per_group  # "slow" waited, a/b/c went on
    expected = [list(range(per_group))] * len(groups)
    assert seen == {"x": expected, "y": expected}
    assert await sqs.depth(url) == 0


@pytest.mark.parametrize("way", ["dlq_queue_url", "redrive_policy"])
async def test_rejected_messages_reach_the_dead_letter_queue(sqs: SqsAdmin, way: str) -> None:
    dlq = await sqs.create_queue()
    if way == "dlq_queue_url":
        url = await sqs.create_queue()
        make = factory(sqs, url, dlq_queue_url=dlq)
        receives = 1
    else:
        receives = 2
        url = await sqs.create_queue(dead_letter_to=dlq, max_receive_count=receives)
        make = factory(sqs, url)
    bodies = [f"{'bad' if i % 4 == 0 else 'good'}-{i}" for i in range(20)]
    await sqs.send(url, bodies)
    bad = sorted(body for body in bodies if body.startswith("bad"))
    # A redelivered copy goes only to who did not ack it (docs/concepts.md#redelivery-memory):
    # "judge" again.
    expected = {
        "judge": Counter({body: receives if body in bad else 1 for body in bodies}),
        "agree": Counter(bodies),
    }
    handled = {name: Counter[str]() for name in ("judge", "agree")}

    async def consume(sub: Subscription, counts: Counter[str]) -> None:
        async with sub:
            async for raw in sub:
                counts[raw["Body"]] += 1
                if sub.subscriber_id == "judge" and raw["Body"].startswith("bad"):
                    reject_shared_stream_event()
                if counts == expected[sub.subscriber_id]:
                    return

    async with asyncio.timeout(60), SharedStreamManager() as manager:
        subs = [manager.subscribe("dl", name, producer=make) for name in handled]
        await asyncio.gather(*(consume(sub, handled[sub.subscriber_id]) for sub in subs))
    assert handled == expected
    # SQS (and moto) applies a redrive policy on the next receive attempt.
    assert await sqs.drain(url, wait=1) == []
    letters = await sqs.drain(dlq)
    assert sorted(letter["Body"] for letter in letters) == bad
    if way == "dlq_queue_url":
        reasons = {
            letter["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"] for letter in letters
        }
        assert reasons == {"rejected by 1 of 2 subscribers"}


async def test_a_failed_event_comes_back_promptly(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue()
    [message_id] = await sqs.send(url, ["flaky"])
    deliveries: list[tuple[str, dict[str, Any]]] = []
    roster = {"crash", "keep"}

    async def read(sub: Subscription) -> None:
        async with sub:
            async for raw in sub:
                deliveries.append((sub.subscriber_id, raw))
                if raw["Body"] == "end":
                    return
                if sub.subscriber_id == "crash" and len(deliveries) <= 2:
                    raise RuntimeError("handler crashed")
                if sub.subscriber_id == "crash":
                    await sqs.send(url, ["end"])

    async def crash_then_retry(make: Callable[[], SqsStreamProducer]) -> None:
        with pytest.raises(RuntimeError):
            await read(manager.subscribe("f", "crash", producer=make, roster=roster))
        await read(manager.subscribe("f", "crash", producer=make, roster=roster))

    # visibility_timeout is 120 s: only the adapter's visibility 0 brings it back in time.
    async with SharedStreamManager() as manager:
        make = factory(sqs, url, visibility_timeout=120)
        kept = manager.subscribe("f", "keep", producer=make, roster=roster)
        async with asyncio.timeout(15):
            await asyncio.gather(crash_then_retry(make), read(kept))
    flaky = [
        (name, raw["Attributes"]["ApproximateReceiveCount"])
        for name, raw in deliveries
        if raw["MessageId"] == message_id
    ]
    # The copy goes to the handler that crashed, not to "keep", which acked the first
    # (docs/concepts.md#redelivery-memory).
    assert sorted(flaky) == [("crash", "1"), ("crash", "2"), ("keep", "1")]


async def test_a_handler_slower_than_the_visibility_timeout_sees_no_redelivery(
    sqs: SqsAdmin,
) -> None:
    url = await sqs.create_queue()
    [first] = await sqs.send(url, ["slow"])
    deliveries: list[dict[str, Any]] = []
    sentinel: list[str] = []

    async with asyncio.timeout(30), SharedStreamManager() as manager:
        sub = manager.subscribe("hb", "slow", producer=factory(sqs, url, visibility_timeout=2))
        async with sub:
            async for raw in sub:
                deliveries.append(raw)
                if raw["MessageId"] == first and not sentinel:
                    await asyncio.sleep(7)  # the slow handler: 3.5 visibility timeouts
                    sentinel.extend(await sqs.send(url, ["sentinel"]))
                elif raw["MessageId"] in sentinel:
                    break
    assert [raw["MessageId"] for raw in deliveries] == [first, *sentinel]
    assert deliveries[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert await sqs.depth(url) == 0


async def test_a_consumer_cancelled_mid_stream_and_restarted_loses_nothing(
    sqs: SqsAdmin,
) -> None:
    url = await sqs.create_queue()
    # A third stored before the cancel, two thirds left for the restarted consumer.
    ids = set(await sqs.send(url, [f"m{i}" for i in range(150)]))
    stored: list[str] = []
    halfway = asyncio.Event()

    async def handle(sub: Subscription) -> AsyncIterator[str]:
        async for raw in sub:
            yield raw["MessageId"]
            if set(stored) == ids:
                return

    async def store(message_id: object) -> None:
        stored.append(str(message_id))
        if len(stored) == 50:
            halfway.set()

    # visibility_timeout 120 s: what the cancelled consumer held must come back at once.
    make = factory(sqs, url, visibility_timeout=120, max_messages=10)
    async with asyncio.timeout(60), SharedStreamManager() as manager:
        first = asyncio.create_task(
            manager.run_subscriber("c", "svc", handle, producer=make, sink=store)
        )
        await halfway.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert len(set(stored)) < len(ids)
        await manager.run_subscriber("c", "svc", handle, producer=make, sink=store)
    assert set(stored) == ids
    assert await sqs.depth(url) == 0


async def test_closing_releases_what_a_long_poll_in_flight_picks_up(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue()
    [first] = await sqs.send(url, ["first"])
    make = factory(sqs, url, wait_time_seconds=3, visibility_timeout=120)
    async with asyncio.timeout(20), SharedStreamManager() as manager:
        sub = manager.subscribe("poll", "only", producer=make)
        raw = await anext(sub)
        assert raw["MessageId"] == first
        # The group polls on at once: a long poll on the empty queue is in flight.
        leaving = asyncio.create_task(sub.aclose())
        [second] = await sqs.send(url, ["second"])
        await leaving
        # SQS keeps the abandoned poll open and hands it "second"; closing waited
        # for it and made "second" visible again instead of hiding it for 120 s.
        [back] = await sqs.drain(url, wait=1)
    assert back["MessageId"] == second
    assert back["Attributes"]["ApproximateReceiveCount"] == "2"


async def test_dlq_reason_attribute_names_the_rejecting_subscribers_in_subscription_order(
    sqs: SqsAdmin,
) -> None:
    url, dlq = await sqs.create_queue(), await sqs.create_queue()
    origin = {"origin": {"DataType": "String", "StringValue": "checkout"}}
    [message_id] = await sqs.send(url, ["{not json"], attributes=origin)
    async with asyncio.timeout(60):
        raw = await reject_with_reasons("dl", factory(sqs, url, dlq_queue_url=dlq))
    assert raw["MessageId"] == message_id
    [letter] = await sqs.drain(dlq)
    assert letter["Body"] == "{not json"
    assert letter["MessageAttributes"] == {
        "origin": {"DataType": "String", "StringValue": "checkout"},
        REASON_ATTRIBUTE: {
            "DataType": "String",
            "StringValue": "rejected by 2 of 3 subscribers; "
            "auditor: schema v3 unsupported; parser: bad json",
        },
        "ackgate.original.queue": {"DataType": "String", "StringValue": url},
    }
    assert letter["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"].endswith("; ".join(REASONS))
    assert await sqs.drain(url, wait=1) == []  # deleted from the source queue
