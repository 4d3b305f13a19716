"""Messages per second through SharedStreamManager + SqsStreamProducer.

Runs against ``--endpoint`` (or ``ACKGATE_SQS_ENDPOINT``), else starts moto's
server on a free 127.0.0.1 port. A feeder sends batches of ten while the
subscribers consume, keeping at most ``--backlog`` messages in the queue (sent
and not yet deleted): moto scans the whole queue,
in-flight messages included, on every send and receive, so a deep queue
measures moto's quadratic cost rather than the adapter. The figure is end to end:
sent, received, fanned out to every subscriber, and deleted (queue empty).

    python benchmarks/sqs_throughput.py --messages 2000 --subscribers 1 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from aiobotocore.session import get_session

from ackgate import AdvanceItem, SharedStreamManager, Subscription
from ackgate_sqs import SqsStreamProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from ackgate_test_support.local_server import (
    ServerDidNotStart,
    answers,
    free_port,
    local_server,
)

REGION = "us-east-1"


@contextmanager
def endpoint(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with local_server(
                argv,
                ready=lambda: answers(f"{url}/moto-api/"),
                log=Path(tmp, "moto.log"),
                start_timeout=30,
            ):
                yield url
        except ServerDidNotStart as exc:
            raise SystemExit(str(exc)) from None


async def run(url: str, subscribers: int, messages: int, backlog: int, advances: int) -> float:
    async with get_session().create_client("sqs", region_name=REGION, endpoint_url=url) as sqs:
        queue = (await sqs.create_queue(QueueName=f"bench-{uuid.uuid4().hex[:8]}"))["QueueUrl"]
        seen = [0] * subscribers
        deleted = 0
        advanced = asyncio.Event()

        class Counting(SqsStreamProducer):
            async def advance(self, batch: Sequence[AdvanceItem]) -> None:
                nonlocal deleted
                await super().advance(batch)
                deleted += len(batch)
                advanced.set()

        async def feed() -> None:
            for start in range(0, messages, 10):
                while start - deleted >= backlog:
                    advanced.clear()
                    await advanced.wait()
                entries = [{"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(10)]
                await sqs.send_message_batch(QueueUrl=queue, Entries=entries)

        async def consume(sub: Subscription, index: int) -> None:
            async with sub:
                async for _ in sub:
                    seen[index] += 1
                    if seen[index] == messages:
                        return

        def make() -> SqsStreamProducer:
            return Counting(queue, region_name=REGION, endpoint_url=url, wait_time_seconds=1)

        started = time.perf_counter()
        async with SharedStreamManager(max_concurrent_advances=advances) as manager:
            subs = [manager.subscribe("bench", i, producer=make) for i in range(subscribers)]
            await asyncio.gather(feed(), *(consume(sub, i) for i, sub in enumerate(subs)))
        elapsed = time.perf_counter() - started
        attributes = await sqs.get_queue_attributes(
            QueueUrl=queue,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        left = sum(int(v) for v in attributes["Attributes"].values())
        print(
            f"subscribers={subscribers} messages={messages} max_concurrent_advances={advances} "
            f"seconds={elapsed:.1f} messages/s={messages / elapsed:.0f} left_in_queue={left}",
            flush=True,
        )
        return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=os.environ.get("ACKGATE_SQS_ENDPOINT"))
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--backlog", type=int, default=200)
    parser.add_argument("--max-concurrent-advances", type=int, nargs="+", default=[10])
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with endpoint(args.endpoint) as url:
        for advances in args.max_concurrent_advances:
            for subscribers in args.subscribers:
                asyncio.run(run(url, subscribers, args.messages, args.backlog, advances))


if __name__ == "__main__":
    main()
