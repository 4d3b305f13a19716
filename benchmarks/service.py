"""Service handler concurrency: messages/s with concurrency=64 against concurrency=1.

Three per-message handlers, each awaiting a 2 ms ``asyncio.sleep`` per message (an
I/O-bound handler), read M messages spread round-robin over 16 partitions (lanes)
of the in-process memory broker. Each case runs a fresh broker and service until
every message is committed, for ``ordering="none"`` and ``ordering="lane"``, at
concurrency 1 and 64. The ratio is concurrency 64 over concurrency 1: at most
2 ms x 64 / 2 ms = 32x with ``"none"``, and 16x with ``"lane"`` (16 lanes, one
message at a time each). Then one batch handler case: one handler with
``batch_size=500``, no sleep, to show the cost per message of a batch.

    python benchmarks/service.py                  # 20,000 messages (about 90 s)
    python benchmarks/service.py --messages 2000  # a quicker run
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Literal

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

LANES = 16
HANDLERS = ("indexer", "auditor", "notifier")
SLEEP = 0.002


def _broker(messages: int) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("bench", LANES)
    for n in range(messages):
        broker.publish("bench", b"message %d" % n)  # unkeyed: round-robin over partitions
    return broker


async def _drain(broker: MemoryBroker, service: Service) -> float:
    """Run ``service`` until every message is committed; the seconds it took."""
    started = time.perf_counter()
    running = asyncio.create_task(service.run())
    await broker.wait_drained("bench", "bench")
    elapsed = time.perf_counter() - started
    await service.stop()
    await running
    return elapsed


async def per_message(messages: int, concurrency: int, ordering: Literal["none", "lane"]) -> float:
    broker = _broker(messages)
    service = Service("bench", producer=lambda: MemoryStreamProducer(broker, "bench", "bench"))

    async def handle(message: Message) -> None:
        await asyncio.sleep(SLEEP)

    for handler_id in HANDLERS:
        service.handler(handler_id, concurrency=concurrency, ordering=ordering)(handle)
    return messages / await _drain(broker, service)


async def batched(messages: int) -> float:
    broker = _broker(messages)
    service = Service("bench", producer=lambda: MemoryStreamProducer(broker, "bench", "bench"))
    sizes: list[int] = []

    @service.handler("bulk", batch_size=500, batch_wait=0.01)
    async def bulk(batch: list[Message]) -> None:
        sizes.append(len(batch))

    return messages / await _drain(broker, service)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="default: %(default)s")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each case's stop logs the group pausing
    print(
        f"{opts.messages} messages, {LANES} lanes, {len(HANDLERS)} handlers x "
        f"{SLEEP * 1000:g} ms sleep per message\n"
    )
    print(f"{'ordering':<10}{'concurrency':>12}{'messages/s':>14}{'ratio':>9}")
    for ordering in ("none", "lane"):
        rates = {c: asyncio.run(per_message(opts.messages, c, ordering)) for c in (1, 64)}
        for concurrency, rate in rates.items():
            ratio = f"{rate / rates[1]:.1f}x" if concurrency > 1 else ""
            print(f"{ordering:<10}{concurrency:>12}{rate:>14,.0f}{ratio:>9}")
    rate = asyncio.run(batched(opts.messages))
    print(f"\nbatch handler (batch_size=500, no sleep): {rate:,.0f} messages/s")


if __name__ == "__main__":
    main()
