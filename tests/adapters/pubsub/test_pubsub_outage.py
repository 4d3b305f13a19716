"""docs/failure-semantics.md#broker-outages on Pub/Sub: the endpoint goes away and comes back; the
service recovers by itself.

The emulator is the test's own (stopped and started again on the same port) and loses
its topics and subscriptions when it stops, so the test creates them again once it is
back, as an operator would, and checks that new messages flow again (the group ends on
the failed pull and supervision restarts it), with one WARNING on ``ackgate.upstream``
while the endpoint is away and one INFO once it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from google.pubsub_v1 import Subscription

from ackgate import Message, Service
from ackgate.testing._local import (
    PUBSUB_EMULATOR,
    free_port,
    local_server,
    pubsub_emulator_ready,
)
from ackgate_pubsub import PubSubStreamProducer

from .pubsub_support import PROJECT, PubSubAdmin

TOPIC = f"projects/{PROJECT}/topics/outage"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/outage"


class Emulator:
    """The Pub/Sub emulator on a fixed port, stopped and started again by the test."""

    def __init__(self, workdir: Path) -> None:
        self.host = f"127.0.0.1:{free_port()}"
        self.workdir = workdir
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> None:
        emulator = Path(os.environ.get("ACKGATE_PUBSUB_EMULATOR_BIN") or PUBSUB_EMULATOR)
        host, port = self.host.split(":")
        stack = contextlib.ExitStack()
        stack.enter_context(
            local_server(
                [str(emulator), f"--host={host}", f"--port={port}"],
                ready=lambda: pubsub_emulator_ready(self.host),
                log=self.workdir / "emulator.log",
                start_timeout=60.0,
                cwd=str(self.workdir),
            )
        )
        self._stack = stack

    def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


async def publish(host: str, bodies: list[str]) -> None:
    """Create the topic and subscription (again) and publish ``bodies``."""
    admin = PubSubAdmin(host)
    try:
        await admin.publisher.create_topic(name=TOPIC)
        await admin.subscriber.create_subscription(
            request=Subscription(name=SUBSCRIPTION, topic=TOPIC, ack_deadline_seconds=10)
        )
        await admin.publish(TOPIC, bodies)
    finally:
        await admin.aclose()


async def until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """The service runs in this loop but nothing signals these states: poll them."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_service_recovers_when_the_pubsub_endpoint_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="ackgate")
    emulator = Emulator(tmp_path)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    await asyncio.to_thread(emulator.start)
    try:
        await publish(emulator.host, ["before-1", "before-2"])
        bodies: list[bytes] = []
        producers: list[PubSubStreamProducer] = []

        def make() -> PubSubStreamProducer:
            producers.append(PubSubStreamProducer(SUBSCRIPTION, ack_deadline=10, pull_timeout=1))
            return producers[-1]

        service = Service("pubsub-outage", producer=make)

        @service.handler("collect")
        async def collect(message: Message) -> None:
            bodies.append(message.body)

        def connected() -> bool | None:
            group = service.stats().group
            return None if group is None else group.upstream_connected

        async def scenario() -> None:
            await until(lambda: len(bodies) == 2, 30, "the first messages")
            # Acked before the endpoint goes: the emulator forgets ack ids when it stops.
            await until(lambda: not producers[0]._leases, 30, "the first messages are not acked")

            await asyncio.to_thread(emulator.stop)
            await until(lambda: connected() is False, 90, "the outage is not noticed")
            down = service.stats().group
            assert down is not None and down.upstream_down_since is not None

            await asyncio.to_thread(emulator.start)
            await publish(emulator.host, ["after-1", "after-2"])
            await until(lambda: connected() is True, 90, "no recovery")
            await until(lambda: len(bodies) == 4, 30, "new messages do not flow")
            # The group ended on the failed pull and supervision restarted it.
            assert service.stats().restarts >= 1

        running = asyncio.create_task(service.run())
        try:
            await scenario()
        finally:
            await service.stop(timeout=5)
            await running
    finally:
        await asyncio.to_thread(emulator.stop)

    assert sorted(bodies) == [b"after-1", b"after-2", b"before-1", b"before-2"]
    outage = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ackgate.upstream"]
    assert [level for level, _ in outage] == [logging.WARNING, logging.INFO], outage
    assert emulator.host in outage[0][1] and SUBSCRIPTION in outage[0][1]
