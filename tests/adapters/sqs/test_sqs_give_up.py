"""docs/failure-semantics.md#poison-messages on SQS: ``Message.attempt`` is the
``ApproximateReceiveCount``, a message that always fails is dead-lettered to ``dlq_queue_url`` after
``give_up_after`` attempts, and the count survives a process stop (the crash loop)."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ackgate import Message, Redelivery, Service
from ackgate_sqs import REASON_ATTRIBUTE, SqsStreamProducer

from .sqs_support import REGION, SqsAdmin

HERE = Path(__file__).resolve().parent


def factory(sqs: SqsAdmin, url: str, **options: Any) -> Callable[[], SqsStreamProducer]:
    # A short long poll keeps group shutdown quick: closing waits for a poll in flight.
    return lambda: SqsStreamProducer(
        url, region_name=REGION, endpoint_url=sqs.endpoint, wait_time_seconds=1, **options
    )


async def test_a_message_that_always_fails_is_dead_lettered_after_give_up_after_attempts(
    sqs: SqsAdmin,
) -> None:
    url, dlq = await sqs.create_queue(), await sqs.create_queue()
    bodies = ["poison", *(f"ok-{n}" for n in range(5))]
    await sqs.send(url, bodies)
    service = Service(
        "sqs",
        producer=factory(sqs, url, dlq_queue_url=dlq),
        redelivery=Redelivery(backoff=0.2, max_backoff=0.4),
    )
    attempts: list[int | None] = []
    # Each hand-out's broker delivery and loop time: the same delivery, after a backoff.
    raws: list[Any] = []
    times: list[float] = []
    handled: dict[str, Counter[str]] = {"picky": Counter(), "other": Counter()}
    done = asyncio.Event()

    def finished() -> None:
        if attempts[-1:] == [3] and all(len(seen) == 5 for seen in handled.values()):
            done.set()

    @service.handler("picky", give_up_after=3)
    async def picky(message: Message) -> None:
        if message.body == b"poison":
            attempts.append(message.attempt)
            raws.append(message.raw)
            times.append(asyncio.get_running_loop().time())
            finished()
            raise ValueError("bad row")
        handled["picky"][message.body.decode()] += 1
        finished()

    @service.handler("other")
    async def other(message: Message) -> None:
        if message.body != b"poison":
            handled["other"][message.body.decode()] += 1
        finished()

    async with asyncio.timeout(60):
        running = asyncio.create_task(service.run())
        await done.wait()
        await service.stop()  # the last call has returned: its reject is advanced
        await running
    assert attempts == [1, 2, 3]
    # Handed again in-process (the broker never redelivered it), after each backoff's
    # lower bound (half its ceiling): 0.1 s, then 0.2 s.
    assert all(raw is raws[0] for raw in raws)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps
    assert handled["picky"] == handled["other"] == Counter(bodies[1:])  # nothing else lost
    assert service.stats().handlers["picky"].gave_up == 1
    (letter,) = await sqs.drain(dlq)
    assert letter["Body"] == "poison"
    assert letter["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"] == (
        "rejected by 1 of 2 subscribers; picky: gave up after 3 attempts: ValueError: bad row"
    )
    assert await sqs.drain(url, wait=1) == []


async def test_a_call_failing_during_a_stop_costs_its_message_no_receive_no_handler_saw(
    sqs: SqsAdmin,
) -> None:
    """The group stops polling when the stop begins, but the long poll in flight
    then stays open on SQS's side while the handler finishes, so the failed message
    is released with that poll in flight. SQS answers the poll with it even though
    the stopping process never hands it to a handler: one receive more, and a
    give_up_after of 3 would give up after 2 calls."""
    url = await sqs.create_queue()
    await sqs.send(url, ["fails"])
    service = Service(
        "sqs",
        producer=lambda: SqsStreamProducer(
            url,
            region_name=REGION,
            endpoint_url=sqs.endpoint,
            wait_time_seconds=3,  # the poll in flight outlasts the stop's release
            visibility_timeout=300,
        ),
    )
    attempts: list[int | None] = []
    called, fail = asyncio.Event(), asyncio.Event()

    @service.handler("failing")
    async def failing(message: Message) -> None:
        attempts.append(message.attempt)
        called.set()
        await fail.wait()
        raise ValueError("failed while the service stops")

    async with asyncio.timeout(60):
        running = asyncio.create_task(service.run())
        await called.wait()
        stopping = asyncio.create_task(service.stop())
        await asyncio.sleep(0)  # one pass of the loop: stop() asks for the stop at once
        fail.set()
        await stopping
        await running
        [back] = await sqs.drain(url, wait=1)  # released by the stop: no 300 s wait
    assert attempts == [1]
    # That call's receive and this one; a receive for no handler would make it 3.
    assert back["Attributes"]["ApproximateReceiveCount"] == "2"


async def test_a_message_that_stops_the_process_is_given_up_past_give_up_after(
    sqs: SqsAdmin, tmp_path: Path
) -> None:
    """The crash loop: the handler never *fails* the message, its process dies on it
    (SIGKILL: no result, no release; SQS brings it back after the visibility timeout).
    SQS counts the receives across processes, so the third process gives up on it
    without a call.

    A real death, not a cancelled ``run()``: a cancelled call fails and is released,
    the ordinary retry path; only a death leaves the message to SQS alone."""
    url, dlq = await sqs.create_queue(), await sqs.create_queue()
    await sqs.send(url, ["deadly"])
    command = [sys.executable, str(HERE / "crashloop_consumer.py"), sqs.endpoint]
    command += [url, dlq, str(tmp_path), "2"]
    for _ in range(2):
        assert _run_to_death(command, tmp_path) == -signal.SIGKILL, "see err"
    last = _start(command, tmp_path)
    try:
        async with asyncio.timeout(60):
            letters = await _received(sqs, dlq)
    finally:
        last.send_signal(signal.SIGTERM)
        assert last.wait(timeout=30) == 0, (tmp_path / "err").read_text()
    assert (tmp_path / "deadly.log").read_text().split() == ["1", "2"]
    assert (tmp_path / "gave_up").read_text() == "1"
    assert letters[0]["Body"] == "deadly"
    assert letters[0]["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"].startswith(
        "rejected by 1 of 1 subscribers; deadly: gave up after 2 attempts: not resolved"
    )


def _start(command: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stderr=(workdir / "err").open("ab"))


def _run_to_death(command: list[str], workdir: Path) -> int:
    """Run the consumer until it exits (it kills itself); its return code."""
    process = _start(command, workdir)
    try:
        return process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def _received(sqs: SqsAdmin, url: str) -> list[dict[str, Any]]:
    """Long-poll ``url`` until it holds something; bound it with ``asyncio.timeout``."""
    while True:
        letters = await sqs.drain(url, wait=1, once=True)
        if letters:
            return letters


def test_the_dead_letter_destination_is_dlq_queue_url_only() -> None:
    # Without it a reject is released to the queue's redrive policy, if there is one:
    # give_up_after is then refused (the service would not know where it went).
    url = "http://localhost:4566/000000000000/q"
    assert SqsStreamProducer(url).dead_letter_destination() is None
    assert SqsStreamProducer(url, dlq_queue_url=url + "-dlq").dead_letter_destination() == (
        f"SQS queue {url}-dlq"
    )
