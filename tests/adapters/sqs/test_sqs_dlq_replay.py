"""docs/dead-letters.md on SQS: ``ackgate dlq list`` groups the dead-letter queue by handler
and reason (and leaves it as it was), ``replay --to-handler`` sends the message back to its
source queue for that handler only and deletes it from the DLQ; the other handler acks it
unseen; rejected again, it is in the DLQ once, as a replay."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from ackgate import Message, Reject, Service
from ackgate._operating.cli import main
from ackgate_sqs import SqsStreamProducer

from .sqs_support import REGION, SqsAdmin


async def serve(sqs: SqsAdmin, url: str, dlq: str, broken: set[bytes], expect: int) -> Counter[str]:
    """A store and a checker (it rejects ``broken`` bodies) until ``expect`` calls of
    the checker, then the queue drained; the calls per handler and body."""
    calls: Counter[str] = Counter()
    checked = asyncio.Event()
    service = Service(
        "sqs",
        producer=lambda: SqsStreamProducer(
            url,
            region_name=REGION,
            endpoint_url=sqs.endpoint,
            wait_time_seconds=1,
            dlq_queue_url=dlq,
        ),
    )

    @service.handler("store")
    async def store(message: Message) -> None:
        calls["store"] += 1

    @service.handler("checker")
    async def checker(message: Message) -> None:
        calls["checker"] += 1
        calls[message.body.decode()] += 1
        if calls["checker"] == expect:
            checked.set()
        if message.body in broken:
            raise Reject("no such customer")

    async with asyncio.timeout(60):
        task = asyncio.create_task(service.run())
        await checked.wait()
        await service.stop()
        await task
    return calls


async def dlq(capsys: pytest.CaptureFixture[str], *args: str, sqs: SqsAdmin, queue: str) -> str:
    options = ["-o", f"endpoint_url={sqs.endpoint}", "-o", f"region_name={REGION}"]
    status = await asyncio.to_thread(main, ["dlq", args[0], "sqs", queue, *options, *args[1:]])
    assert status == 0
    return capsys.readouterr().out


async def test_dead_letters_listed_and_replayed_to_one_handler_on_sqs(
    sqs: SqsAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    url, dead = await sqs.create_queue(), await sqs.create_queue()
    await sqs.send(url, ["a", "b", "c"])
    first = await serve(sqs, url, dead, {b"b", b"c"}, expect=3)
    assert (first["store"], first["checker"]) == (3, 3)

    listed = json.loads(await dlq(capsys, "list", "--json", sqs=sqs, queue=dead))
    assert listed["total"] == 2
    (row,) = listed["groups"]
    assert (row["handler"], row["reason"], row["count"]) == ("checker", "no such customer", 2)
    assert await sqs.depth(dead) == 2  # listing removed nothing

    out = await dlq(
        capsys, "replay", "--handler", "checker", "--to-handler", "checker", sqs=sqs, queue=dead
    )
    assert "replayed 2 of 2 dead letters to handler 'checker' only" in out
    second = await serve(sqs, url, dead, {b"c"}, expect=2)
    assert second["store"] == 0 and (second["b"], second["c"]) == (1, 1)

    listed = json.loads(await dlq(capsys, "list", "--json", sqs=sqs, queue=dead))
    assert (listed["total"], listed["replays"]) == (1, 1)  # c, once, as a replay
    out = await dlq(capsys, "replay", "--all", "--dry-run", sqs=sqs, queue=dead)
    assert "0 of 1 dead letters would be replayed" in out
