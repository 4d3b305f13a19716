"""What a stop costs on SQS: receives no handler saw, and how soon a failure comes back.

Runs against ``--endpoint`` (or ``ACKGATE_SQS_ENDPOINT``; real SQS too, e.g.
``https://sqs.eu-west-1.amazonaws.com`` with ``--region eu-west-1`` and your
credentials: it creates and deletes two queues), else starts moto's server.

* ``--rounds N`` services in a row, each stopped while its handler fails the one
  message of a fresh queue. Each round's call should see ``Message.attempt`` one
  higher than the last: the attempts printed must be 1..N. A gap is a receive that
  no handler saw (the stopping service's long poll took the released message).
* Then the seconds from a failed call to the redelivered call on an idle queue: a
  release waits for the long poll in flight, so up to ``--wait`` seconds.

    python benchmarks/sqs_stop.py --rounds 5 --wait 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

from aiobotocore.session import get_session
from sqs_throughput import endpoint

from ackgate import Message, Service
from ackgate_sqs import SqsStreamProducer


def make_service(url: str, options: dict[str, Any]) -> Service:
    return Service(
        "sqs-stop", producer=lambda: SqsStreamProducer(url, visibility_timeout=300, **options)
    )


async def one_stop(url: str, options: dict[str, Any]) -> int | None:
    """A service whose call fails the message while the service stops; its attempt."""
    service = make_service(url, options)
    called, fail = asyncio.Event(), asyncio.Event()
    attempts: list[int | None] = []

    @service.handler("fails-during-the-stop")
    async def handle(message: Message) -> None:
        attempts.append(message.attempt)
        called.set()
        await fail.wait()
        raise RuntimeError("failed while the service stops")

    running = asyncio.create_task(service.run())
    await called.wait()
    stopping = asyncio.create_task(service.stop())
    await asyncio.sleep(0)  # stop() asks for the stop in its first step
    fail.set()
    await stopping
    await running
    return attempts[0]


async def redelivery_seconds(url: str, options: dict[str, Any]) -> float:
    service = make_service(url, options)
    calls: list[float] = []
    again = asyncio.Event()

    @service.handler("fails-once")
    async def handle(message: Message) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("first call fails")
        again.set()

    running = asyncio.create_task(service.run())
    await again.wait()
    await service.stop()
    await running
    return calls[1] - calls[0]


async def main(url: str, region: str, rounds: int, wait: int) -> None:
    options = {"region_name": region, "endpoint_url": url, "wait_time_seconds": wait}
    async with get_session().create_client("sqs", region_name=region, endpoint_url=url) as sqs:
        queues = []
        for _ in range(2):
            name = f"bench-stop-{uuid.uuid4().hex[:8]}"
            queues.append((await sqs.create_queue(QueueName=name))["QueueUrl"])
            await sqs.send_message(QueueUrl=queues[-1], MessageBody="one")
        try:
            attempts = [await one_stop(queues[0], options) for _ in range(rounds)]
            print(f"attempts seen over {rounds} stops: {attempts} (expected 1..{rounds})")
            seconds = await redelivery_seconds(queues[1], options)
            print(f"failed call -> redelivered call, idle queue, wait {wait} s: {seconds:.2f} s")
        finally:
            for queue in queues:
                await sqs.delete_queue(QueueUrl=queue)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default=os.environ.get("ACKGATE_SQS_ENDPOINT"))
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wait", type=int, default=3, help="wait_time_seconds (0-20)")
    args = parser.parse_args()
    if "amazonaws.com" not in (args.endpoint or ""):  # an emulator takes any credentials
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with endpoint(args.endpoint) as url:
        asyncio.run(main(url, args.region, args.rounds, args.wait))
