"""Long-run memory check: RSS must stay flat however long the stream is
(docs/production.md#max_outstanding).

N events (default 2,000,000) fanned out to S subscribers (default 4) in ack mode;
each subscriber binds one output per event and confirms them in batches, every
event is advanced. Run twice: with 16 lanes, and with one lane per event (lane
keys never repeat, as with SQS). Prints the process's RSS at intervals and the
ratio of the last sample to the first one taken after warm-up (10% of the
events). A ratio near 1.0 means flat.

    python benchmarks/memory_soak.py                  # both shapes, 2M events
    python benchmarks/memory_soak.py --events 200000  # a quicker run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ackgate import AdvanceItem, SharedStreamManager, SharedStreamProducer

FETCH = 256
CONFIRM_EVERY = 64


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class SoakProducer(SharedStreamProducer):
    def __init__(self, n: int, lanes: int | None) -> None:
        self.n = n
        self.lanes = lanes
        self.advanced = 0

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        for i in range(self.n):
            if i % FETCH == 0:
                await asyncio.sleep(0)
            yield f"event-{i}", i
        await asyncio.Event().wait()

    def get_advance_lane(self, broker_payload: Any) -> Any:
        return broker_payload if self.lanes is None else broker_payload % self.lanes

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.advanced += len(batch)


async def soak(n: int, s: int, lanes: int | None, samples: int) -> tuple[float, float, float]:
    producer = SoakProducer(n, lanes)
    every = max(1, n // samples)
    warm_at = n // 10
    readings: list[tuple[int, float]] = []
    async with SharedStreamManager(subscriber_queue_size=4096) as manager:
        confirm = manager.confirm_persisted

        async def consume(index: int) -> None:
            pending: list[int | None] = []
            count = 0
            async with manager.subscribe("soak", index, producer=lambda: producer) as sub:
                async for _ in sub:
                    pending.append(sub.bind())
                    count += 1
                    if len(pending) == CONFIRM_EVERY:
                        confirm(pending)  # type: ignore[arg-type]
                        pending = []
                    if index == 0 and count % every == 0:
                        gc.collect()
                        readings.append((count, rss_mib()))
                        print(f"  {count:>10,} events  RSS {readings[-1][1]:7.1f} MiB", flush=True)
                    if count == n:
                        break
                confirm(pending)  # type: ignore[arg-type]

        # The last subscriber to leave returns after the final advances.
        await asyncio.gather(*(consume(i) for i in range(s)))
    assert producer.advanced == n, (producer.advanced, n)
    warm = next(rss for count, rss in readings if count >= warm_at)
    return readings[0][1], warm, readings[-1][1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args(argv)
    for lanes, label in ((16, "16 lanes"), (None, "one lane per event")):
        print(f"{args.events:,} events x {args.subscribers} subscribers, {label}:")
        started = time.perf_counter()
        first, warm, last = asyncio.run(soak(args.events, args.subscribers, lanes, args.samples))
        elapsed = time.perf_counter() - started
        print(
            f"  first {first:.1f} MiB, after warm-up {warm:.1f} MiB, end {last:.1f} MiB:"
            f" end / warm = {last / warm:.3f}  ({elapsed:.0f} s)\n"
        )


if __name__ == "__main__":
    main()
