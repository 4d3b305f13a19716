"""Pub/Sub throughput against the local emulator: plain pull/ack vs ackgate x1 and x4.

    python benchmarks/pubsub_throughput.py [--messages 20000]

Uses ``PUBSUB_EMULATOR_HOST`` when set, else starts Google's emulator from the Cloud
SDK on a free 127.0.0.1 port (as the tests do). Each run gets a fresh subscription
that already holds ``--messages`` messages, then consumes all of them:

* **plain**: ``pull`` (1000 at a time) and one ``acknowledge`` per pulled batch;
* **ackgate xN**: one :class:`PubSubStreamProducer` group, N subscribers that each
  read every message; the run ends when the last subscriber left and the group
  stopped (final acks done, clients closed).

Time runs from the first message received to the end. Each run then checks that a
pull finds nothing left. The emulator is a test double: its figures say nothing about
the real service. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from google.api_core.exceptions import DeadlineExceeded
from google.pubsub_v1 import PublisherAsyncClient, PubsubMessage, SubscriberAsyncClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

from ackgate import SharedStreamManager, Subscription
from ackgate_pubsub import PubSubStreamProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from ackgate_test_support.local_server import (
    ServerDidNotStart,
    answers,
    free_port,
    local_server,
)

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
PROJECT = "ackgate-bench"


class Admin:
    def __init__(self, host: str) -> None:
        self.sub = SubscriberAsyncClient(
            transport=SubscriberGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(host))
        )
        self.pub = PublisherAsyncClient(
            transport=PublisherGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(host))
        )

    async def filled_subscription(self, messages: int, size: int) -> str:
        suffix = uuid.uuid4().hex[:12]
        topic = f"projects/{PROJECT}/topics/t-{suffix}"
        subscription = f"projects/{PROJECT}/subscriptions/s-{suffix}"
        await self.pub.create_topic(name=topic)
        await self.sub.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=60)
        body = b"x" * size
        for start in range(0, messages, 1000):
            count = min(1000, messages - start)
            await self.pub.publish(
                topic=topic, messages=[PubsubMessage(data=body) for _ in range(count)]
            )
        return subscription

    async def left_over(self, subscription: str) -> int:
        try:
            response = await self.sub.pull(subscription=subscription, max_messages=1000, timeout=3)
        except DeadlineExceeded:
            return 0
        return len(response.received_messages)


async def plain(admin: Admin, subscription: str, messages: int) -> float:
    received, started = 0, 0.0
    while received < messages:
        response = await admin.sub.pull(subscription=subscription, max_messages=1000, timeout=30)
        started = started or time.perf_counter()
        received += len(response.received_messages)
        await admin.sub.acknowledge(
            subscription=subscription, ack_ids=[m.ack_id for m in response.received_messages]
        )
    return time.perf_counter() - started


async def with_ackgate(subscription: str, messages: int, subscribers: int) -> float:
    first: list[float] = []

    async def read(sub: Subscription) -> None:
        seen = set()
        async with sub:
            async for raw in sub:
                if not first:
                    first.append(time.perf_counter())
                seen.add(raw.message.message_id)
                if len(seen) == messages:
                    break

    def make() -> PubSubStreamProducer:
        return PubSubStreamProducer(subscription, max_messages=1000, ack_deadline=60)

    async with SharedStreamManager(ack_timeout=300) as manager:
        subs = [manager.subscribe("bench", n, producer=make) for n in range(subscribers)]
        await asyncio.gather(*(read(sub) for sub in subs))
    return time.perf_counter() - first[0]


async def main(host: str, messages: int, size: int) -> None:
    admin = Admin(host)
    runs = [("plain pull/ack", 0), ("ackgate x1", 1), ("ackgate x4", 4)]
    for label, subscribers in runs:
        subscription = await admin.filled_subscription(messages, size)
        if subscribers:
            elapsed = await with_ackgate(subscription, messages, subscribers)
        else:
            elapsed = await plain(admin, subscription, messages)
        left = await admin.left_over(subscription)
        print(f"{label:15} {messages / elapsed:9.0f} msg/s  ({elapsed:.2f} s, {left} left over)")
    await admin.sub.transport.close()
    await admin.pub.transport.close()


def command_line() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    args = parser.parse_args()
    given = os.environ.get("PUBSUB_EMULATOR_HOST")
    if given:
        asyncio.run(main(given, args.messages, args.size))
        return
    host = f"127.0.0.1:{free_port()}"
    argv = [str(EMULATOR), "--host=127.0.0.1", f"--port={host.rsplit(':', 1)[1]}"]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with local_server(
                argv,
                ready=lambda: answers(f"http://{host}/", b"Ok"),
                log=Path(tmp, "emulator.log"),
                start_timeout=60,
                cwd=tmp,
            ):
                os.environ["PUBSUB_EMULATOR_HOST"] = host
                asyncio.run(main(host, args.messages, args.size))
        except ServerDidNotStart as exc:
            raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    command_line()
