"""docs/failure-semantics.md#broker-outages on SQS: the endpoint goes away and comes back; the
service recovers by itself.

moto's server is the test's own (it is stopped and started again on the same port) and
loses its queues when it stops, so the test creates the queue again once it is back,
as an operator would, and checks that new messages flow through the same group: no
restart, one WARNING while the endpoint is away, one INFO once it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiobotocore.session import get_session

from ackgate import Message, Service
from ackgate.testing._local import answers, free_port, local_server
from ackgate_sqs import SqsStreamProducer

from .sqs_support import REGION

CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
QUEUE = "ackgate-outage"


class Moto:
    """moto's SQS server on a fixed port, stopped and started again by the test."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        stack = contextlib.ExitStack()
        stack.enter_context(
            local_server(
                argv,
                ready=lambda: answers(f"{self.endpoint}/moto-api/"),
                log=self.log,
                start_timeout=30.0,
            )
        )
        self._stack = stack

    def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


async def send(endpoint: str, bodies: list[str]) -> str:
    """Create the queue (again) and send ``bodies``; return its URL."""
    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=endpoint, **CREDENTIALS
    ) as client:
        url = str((await client.create_queue(QueueName=QUEUE))["QueueUrl"])
        for body in bodies:
            await client.send_message(QueueUrl=url, MessageBody=body)
        return url


async def in_flight(endpoint: str, url: str) -> int:
    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=endpoint, **CREDENTIALS
    ) as client:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        response = await client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
        return sum(int(response["Attributes"][name]) for name in names)


async def until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """The service runs in this loop but nothing signals these states: poll them."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_service_recovers_when_the_sqs_endpoint_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ackgate")
    moto = Moto(tmp_path / "moto.log")
    await asyncio.to_thread(moto.start)
    try:
        url = await send(moto.endpoint, ["before-1", "before-2"])
        bodies: list[bytes] = []
        service = Service(
            "sqs-outage",
            producer=lambda: SqsStreamProducer(
                url,
                region_name=REGION,
                endpoint_url=moto.endpoint,
                wait_time_seconds=1,
                **CREDENTIALS,
            ),
        )

        @service.handler("collect")
        async def collect(message: Message) -> None:
            bodies.append(message.body)

        def connected() -> bool | None:
            group = service.stats().group
            return None if group is None else group.upstream_connected

        async def scenario() -> None:
            await until(lambda: len(bodies) == 2, 30, "the first messages")
            # Deleted before the endpoint goes: moto forgets receipt handles when it stops.
            deadline = time.monotonic() + 30
            while await in_flight(moto.endpoint, url):
                assert time.monotonic() < deadline, "the first messages are not deleted"
                await asyncio.sleep(0.05)

            await asyncio.to_thread(moto.stop)
            await until(lambda: connected() is False, 60, "the outage is not noticed")
            down = service.stats().group
            assert down is not None and down.upstream_down_since is not None

            await asyncio.to_thread(moto.start)
            assert await send(moto.endpoint, ["after-1", "after-2"]) == url
            await until(lambda: connected() is True, 60, "no recovery")
            await until(lambda: len(bodies) == 4, 30, "new messages do not flow")

        running = asyncio.create_task(service.run())
        try:
            await scenario()
        finally:
            await service.stop(timeout=5)
            await running
    finally:
        await asyncio.to_thread(moto.stop)

    assert sorted(bodies) == [b"after-1", b"after-2", b"before-1", b"before-2"]
    outage = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ackgate.upstream"]
    assert [level for level, _ in outage] == [logging.WARNING, logging.INFO], outage
    assert url in outage[0][1]
    ackgate_warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("ackgate") and r.levelno >= logging.WARNING
    ]
    # The same group rode the outage out. moto forgets its queues when it stops: a
    # receive that reaches the restarted server before the test created the queue
    # again ends the group (QueueDoesNotExist, a real error), and supervision restarts
    # it. That restart is the emulator's lost state, never the outage's.
    lost_queue = [w for w in ackgate_warnings if "QueueDoesNotExist" in w]
    assert service.stats().restarts == len(lost_queue) <= 1, ackgate_warnings
    assert [w for w in ackgate_warnings if w not in lost_queue] == [outage[0][1]]
