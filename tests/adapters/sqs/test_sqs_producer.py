"""SqsStreamProducer driven directly (open_stream / advance / aclose), no manager."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate_sqs import REASON_ATTRIBUTE, SqsStreamProducer

from .sqs_support import REGION, SqsAdmin

CLEAN = AdvanceOutcome(acked=2, failed=0, rejected=0)
FAILED = AdvanceOutcome(acked=1, failed=1, rejected=0)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)
REJECTED = AdvanceOutcome(acked=1, failed=0, rejected=1)


def producer(sqs: SqsAdmin, url: str, **options: Any) -> SqsStreamProducer:
    options.setdefault("wait_time_seconds", 1)
    return SqsStreamProducer(url, region_name=REGION, endpoint_url=sqs.endpoint, **options)


async def take(stream: AsyncIterator[tuple[Any, Any]], count: int) -> list[tuple[Any, Any]]:
    async with asyncio.timeout(10):
        return [await anext(stream) for _ in range(count)]


@pytest.mark.parametrize(
    "options",
    [
        {"max_messages": 0},
        {"max_messages": 11},
        {"wait_time_seconds": 21},
        {"visibility_timeout": 0},
    ],
)
def test_rejects_out_of_range_arguments(options: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        SqsStreamProducer("http://127.0.0.1:1/123/q", **options)


async def test_lane_is_the_message_on_standard_and_the_group_on_fifo(sqs: SqsAdmin) -> None:
    standard = await sqs.create_queue()
    fifo = await sqs.create_queue(fifo=True)
    ids = await sqs.send(standard, ["a", "b"])
    await sqs.send(fifo, ["c"], group="g-1")
    for url, lanes in ((standard, ids), (fifo, ["g-1"])):
        source = producer(sqs, url)
        stream = source.open_stream()
        try:
            pairs = await take(stream, len(lanes))
            assert [source.get_advance_lane(payload) for _, payload in pairs] == lanes
            await source.advance([AdvanceItem(payload, CLEAN) for _, payload in pairs])
        finally:
            await stream.aclose()
            await source.aclose()
        assert await sqs.depth(url) == 0


async def test_outcomes_delete_release_and_dead_letter(sqs: SqsAdmin) -> None:
    dlq = await sqs.create_queue(fifo=True)
    url = await sqs.create_queue(fifo=True)
    colour = {"colour": {"DataType": "String", "StringValue": "blue"}}
    await sqs.send(url, ["clean", "failed", "nobody", "rejected"], group="g", attributes=colour)
    source = producer(sqs, url, dlq_queue_url=dlq)
    stream = source.open_stream()
    try:
        pairs = await take(stream, 4)
        assert [raw["Body"] for raw, _ in pairs] == ["clean", "failed", "nobody", "rejected"]
        outcomes = [CLEAN, FAILED, NOBODY, REJECTED]
        await source.advance([AdvanceItem(p, o) for (_, p), o in zip(pairs, outcomes, strict=True)])
    finally:
        await stream.aclose()
        await source.aclose()
    async with asyncio.timeout(10):
        back = await sqs.drain(url, wait=1)
        dead = await sqs.drain(dlq, wait=1)
    assert sorted(m["Body"] for m in back) == ["failed", "nobody"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in back] == ["2", "2"]
    [letter] = dead
    assert letter["Body"] == "rejected"
    assert letter["Attributes"]["MessageGroupId"] == "g"
    assert letter["MessageAttributes"]["colour"]["StringValue"] == "blue"
    assert letter["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"] == (
        "rejected by 1 of 2 subscribers"
    )


async def test_heartbeat_keeps_a_held_message_invisible(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue()
    await sqs.send(url, ["slow"])
    source = producer(sqs, url, visibility_timeout=2)
    stream = source.open_stream()
    try:
        [(raw, payload)] = await take(stream, 1)
        # Another consumer long-polls for 2.5 visibility timeouts: the heartbeat
        # must keep the message hidden the whole time.
        assert await sqs.drain(url, wait=5, once=True) == []
        await source.advance([AdvanceItem(payload, CLEAN)])
    finally:
        await stream.aclose()
        await source.aclose()
    assert raw["Attributes"]["ApproximateReceiveCount"] == "1"
    assert await sqs.depth(url) == 0


async def test_aclose_releases_what_was_never_advanced(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue()
    await sqs.send(url, [f"m{i}" for i in range(5)])
    source = producer(sqs, url, max_messages=10, visibility_timeout=300)
    stream = source.open_stream()
    try:
        pairs = await take(stream, 2)
        await source.advance([AdvanceItem(pairs[0][1], CLEAN)])
    finally:
        await stream.aclose()
        await source.aclose()
    async with asyncio.timeout(10):
        back = await sqs.drain(url, wait=1)
    assert len(back) == 4  # one acked; the other four come back without the 300 s wait


def spy_on_receives(source: SqsStreamProducer) -> asyncio.Event:
    """An event set when the producer sends its next ``ReceiveMessage``."""
    sent = asyncio.Event()
    receive = source._client.receive_message

    async def spied(**request: Any) -> Any:
        sent.set()
        return await receive(**request)

    source._client.receive_message = spied
    return sent


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
async def test_a_release_while_closing_waits_for_the_receive_in_flight(
    sqs: SqsAdmin, fifo: bool
) -> None:
    """A group's stop: its poll is cancelled with a long poll in flight, its final
    advances release a failed message, then the producer closes. SQS answers the
    poll in flight with a message made visible meanwhile, even though the client
    hung up: one receive counted that no handler sees. On a FIFO queue, as soon as
    the released message is the last of its group in flight (ElasticMQ and SQS; moto's
    poll never hands out a group that was in flight when the poll began)."""
    url = await sqs.create_queue(fifo=fifo)
    await sqs.send(url, ["fails"], group="g" if fifo else None)
    source = producer(sqs, url, wait_time_seconds=2, visibility_timeout=300)
    stream = source.open_stream()
    try:
        [(raw, payload)] = await take(stream, 1)
        polling = spy_on_receives(source)
        following = asyncio.ensure_future(anext(stream))
        await polling.wait()
        following.cancel()  # the stop cancels the group's poll first
        await asyncio.gather(following, return_exceptions=True)
        await stream.aclose()
        await source.advance([AdvanceItem(payload, FAILED)])  # the final advances
    finally:
        await stream.aclose()
        await source.aclose()
    async with asyncio.timeout(10):
        [back] = await sqs.drain(url, wait=1)  # released: back before the 300 s
    assert raw["Attributes"]["ApproximateReceiveCount"] == "1"
    # The handlers' receive and this one; a receive for no handler would make it 3.
    assert back["Attributes"]["ApproximateReceiveCount"] == "2"


class GatedClient:
    """A receive that answers (nothing) once ``answer`` is set; records the calls."""

    def __init__(self) -> None:
        self.receiving = asyncio.Event()
        self.answer = asyncio.Event()
        self.calls: list[str] = []
        self.released_at = 0.0  # loop time of the last release

    async def receive_message(self, **request: Any) -> Any:
        self.calls.append("receive")
        self.receiving.set()
        await self.answer.wait()
        self.calls.append("answered")
        return {}

    async def change_message_visibility_batch(
        self, QueueUrl: str, Entries: list[dict[str, Any]]
    ) -> Any:
        assert all(entry["VisibilityTimeout"] == 0 for entry in Entries)
        self.calls.extend(f"release {entry['ReceiptHandle']}" for entry in Entries)
        self.released_at = asyncio.get_running_loop().time()
        return {"Successful": [{"Id": entry["Id"]} for entry in Entries]}


def gated(wait_time_seconds: int) -> tuple[SqsStreamProducer, GatedClient, Any]:
    """A producer with one message received and a receive sent (not answered)."""
    source = SqsStreamProducer("http://127.0.0.1:1/123/q", wait_time_seconds=wait_time_seconds)
    client = GatedClient()
    source._client = client
    [held] = fake_payloads(1)
    source._outstanding[held.handle] = held
    source._receiving = asyncio.ensure_future(source._receive())
    return source, client, held


async def test_a_release_is_sent_once_the_receive_in_flight_has_returned() -> None:
    source, client, held = gated(wait_time_seconds=20)
    async with asyncio.timeout(10):
        await client.receiving.wait()
        await source.advance([AdvanceItem(held, FAILED)])
        assert client.calls == ["receive"]  # held while SQS may still answer the poll
        client.answer.set()
        await source._receiving
    assert client.calls == ["receive", "answered", "release rh-0"]


async def test_aclose_abandons_a_receive_that_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closing waits for the receive in flight only until SQS must have answered
    it (its wait, plus a grace): then it abandons it and releases what it holds."""
    monkeypatch.setattr("ackgate_sqs._producer._RECEIVE_GRACE", 0.1)
    source, client, _ = gated(wait_time_seconds=0)
    async with asyncio.timeout(10):
        await client.receiving.wait()
        await source.aclose()
    assert source._receiving is not None and source._receiving.cancelled()
    assert client.calls == ["receive", "release rh-0"]


async def test_a_receive_cancelled_by_someone_else_is_waited_out_before_releasing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The event loop torn down cancels every task, the receive in flight too: the
    client hangs up, but SQS keeps its poll open until its wait runs out."""
    monkeypatch.setattr("ackgate_sqs._producer._RECEIVE_GRACE", 0.1)
    source, client, held = gated(wait_time_seconds=1)
    async with asyncio.timeout(10):
        await client.receiving.wait()
        assert source._receiving is not None
        source._receiving.cancel()
        await asyncio.gather(source._receiving, return_exceptions=True)
        await source.advance([AdvanceItem(held, FAILED)])
        assert client.calls == ["receive"]
        await source.aclose()
    assert client.calls == ["receive", "release rh-0"]
    assert client.released_at >= source._receive_ends  # SQS's poll was over


async def test_stale_receipt_is_logged_not_raised(
    sqs: SqsAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    url = await sqs.create_queue()
    [message_id] = await sqs.send(url, ["once"])
    source = producer(sqs, url)
    stream = source.open_stream()
    try:
        [(_, payload)] = await take(stream, 1)
        await source.advance([AdvanceItem(payload, CLEAN)])
        with caplog.at_level(logging.WARNING, logger="ackgate.adapters.sqs"):
            await source.advance([AdvanceItem(payload, FAILED)])
    finally:
        await stream.aclose()
        await source.aclose()
    assert message_id in caplog.text
    assert "ReceiptHandleIsInvalid" in caplog.text


class FlakyClient:
    """Fails entry "0" of each delete with ``code`` ``failures`` times, then succeeds."""

    def __init__(self, code: str, failures: int) -> None:
        self.code = code
        self.failures = failures
        self.calls: list[list[str]] = []

    async def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.calls.append([entry["Id"] for entry in Entries])
        if self.failures and any(entry["Id"] == "0" for entry in Entries):
            self.failures -= 1
            return {"Failed": [{"Id": "0", "SenderFault": False, "Code": self.code}]}
        return {"Successful": [{"Id": entry["Id"]} for entry in Entries]}


def fake_payloads(count: int) -> list[Any]:
    """Broker payloads as open_stream makes them, without a server."""
    from ackgate_sqs._message import Receipt

    return [
        Receipt({"MessageId": f"id-{i}", "ReceiptHandle": f"rh-{i}"}, f"id-{i}", 0.0)
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("code", "failures", "calls", "logged"),
    [
        (
            "InternalError",
            1,
            [[str(i) for i in range(10)], ["0"], [str(i) for i in range(2)]],
            False,
        ),
        ("InternalError", 3, [[str(i) for i in range(10)], ["0"], ["0"], ["0", "1"]], True),
        ("ReceiptHandleIsInvalid", 1, [[str(i) for i in range(10)], ["0", "1"]], True),
    ],
)
async def test_batch_entry_failures_are_retried_then_logged(
    caplog: pytest.LogCaptureFixture,
    code: str,
    failures: int,
    calls: list[list[str]],
    logged: bool,
) -> None:
    source = SqsStreamProducer("http://127.0.0.1:1/123/q")
    client = FlakyClient(code, failures)
    source._client = client
    payloads = fake_payloads(12)
    with caplog.at_level(logging.WARNING, logger="ackgate.adapters.sqs"):
        await source.advance([AdvanceItem(p, CLEAN) for p in payloads])
    assert client.calls == calls  # chunks of ten; a stale handle is not retried
    assert ("id-0" in caplog.text) is logged


async def test_concurrent_advances_share_one_batch_call() -> None:
    source = SqsStreamProducer("http://127.0.0.1:1/123/q")
    client = FlakyClient("InternalError", 0)
    source._client = client
    payloads = fake_payloads(12)
    await asyncio.gather(*(source.advance([AdvanceItem(p, CLEAN)]) for p in payloads))
    assert client.calls == [[str(i) for i in range(10)], ["0", "1"]]
