"""Fan-out throughput and memory of ackgate against a bare-asyncio floor, in one run.

For S subscribers x L lanes x two shapes, N events each:

* floor      one asyncio.Queue per subscriber, each consumer an async generator;
* fast path  ackgate with source= (no bookkeeping);
* ack mode   ackgate with a producer, one derived output bound per event per
             subscriber, confirmed in batches of 64, every event advanced.

Shapes: *burst* (subscribers drain without yielding) and *interleaved* (each
subscriber awaits asyncio.sleep(0) per event). Both upstreams hand control to the
loop every FETCH events, as a broker client does between fetches. Queues are sized
to N on both sides (the floor's are unbounded), so no subscriber overflows.

With ``--event-ids`` the ack-mode producer also gives every event an id
(``get_event_id``), so the group remembers who acked it (redelivery memory): the
cost of that bookkeeping for a broker whose adapter has ids, as all of ours do.

Prints µs per subscriber delivery (best of --repeat), the ratio to the floor of the
same S and shape, and the peak traced memory of one extra run per cell. Then
bytes per outstanding event: N events held outstanding by one subscriber that
never resolves the first one, at S = 1 and S = 100.

    python benchmarks/throughput.py            # the full table
    python benchmarks/throughput.py --quick    # a smaller smoke run
    python benchmarks/throughput.py --event-ids --no-memory --lanes 1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from functools import partial
from typing import Any

from ackgate import AdvanceItem, SharedStreamManager, SharedStreamProducer

FETCH = 256
CONFIRM_EVERY = 64


async def _upstream(n: int) -> AsyncIterator[int]:
    for i in range(n):
        if i % FETCH == 0:
            await asyncio.sleep(0)
        yield i


# -- floor ----------------------------------------------------------------------------


async def run_floor(n: int, s: int, interleaved: bool) -> None:
    queues: list[asyncio.Queue[int | None]] = [asyncio.Queue() for _ in range(s)]

    async def events(queue: asyncio.Queue[int | None]) -> AsyncIterator[int]:
        while (item := await queue.get()) is not None:
            yield item

    async def consume(queue: asyncio.Queue[int | None]) -> int:
        count = 0
        async for _ in events(queue):
            count += 1
            if interleaved:
                await asyncio.sleep(0)
        return count

    async def produce() -> None:
        async for i in _upstream(n):
            for queue in queues:
                queue.put_nowait(i)
        for queue in queues:
            queue.put_nowait(None)

    counts = await asyncio.gather(produce(), *(consume(q) for q in queues))
    assert counts[1:] == [n] * s


# -- ackgate ----------------------------------------------------------------------------


class BenchProducer(SharedStreamProducer):
    def __init__(self, n: int, lanes: int) -> None:
        self.n = n
        self.lanes = lanes
        self.advanced = 0

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        for i in range(self.n):
            if i % FETCH == 0:
                await asyncio.sleep(0)
            yield i, i
        await asyncio.Event().wait()

    def get_advance_lane(self, broker_payload: Any) -> int:
        return broker_payload % self.lanes  # type: ignore[no-any-return]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.advanced += len(batch)


class IdentifiedBenchProducer(BenchProducer):
    """Every event has an id (``--event-ids``): the group remembers who acked it."""

    def get_event_id(self, broker_payload: Any) -> int:
        return broker_payload  # type: ignore[no-any-return]


async def _endless(n: int) -> AsyncIterator[int]:
    for i in range(n):
        if i % FETCH == 0:
            await asyncio.sleep(0)
        yield i
    await asyncio.Event().wait()  # a broker stream never ends by itself


async def run_fast(n: int, s: int, interleaved: bool) -> None:
    async with SharedStreamManager(subscriber_queue_size=n) as manager:

        async def consume(index: int) -> int:
            count = 0
            async with manager.subscribe("bench", index, source=lambda: _endless(n)) as sub:
                async for _ in sub:
                    count += 1
                    if count == n:
                        break
                    if interleaved:
                        await asyncio.sleep(0)
            return count

        counts = await asyncio.gather(*(consume(i) for i in range(s)))
    assert counts == [n] * s


async def run_ack(n: int, s: int, interleaved: bool, lanes: int, ids: bool = False) -> None:
    producer = (IdentifiedBenchProducer if ids else BenchProducer)(n, lanes)
    async with SharedStreamManager(subscriber_queue_size=n) as manager:
        confirm = manager.confirm_persisted

        async def consume(index: int) -> int:
            count = 0
            pending: list[int | None] = []
            async with manager.subscribe("bench", index, producer=lambda: producer) as sub:
                async for _ in sub:
                    pending.append(sub.bind())
                    count += 1
                    if len(pending) == CONFIRM_EVERY:
                        confirm(pending)  # type: ignore[arg-type]
                        pending = []
                    if count == n:
                        break
                    if interleaved:
                        await asyncio.sleep(0)
                confirm(pending)  # type: ignore[arg-type]
            return count

        counts = await asyncio.gather(*(consume(i) for i in range(s)))
    assert counts == [n] * s
    assert producer.advanced == n, producer.advanced


# -- measuring --------------------------------------------------------------------------


def timed(make: Callable[[], Coroutine[Any, Any, None]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        asyncio.run(make())
        best = min(best, time.perf_counter() - start)
    return best


def peak_memory(make: Callable[[], Coroutine[Any, Any, None]]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        asyncio.run(make())
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def outstanding_memory(n: int, s: int) -> tuple[int, int]:
    """Bytes traced with ``n`` events outstanding (one subscriber never resolves event 0)."""
    producer = BenchProducer(n, lanes=1)
    async with SharedStreamManager(subscriber_queue_size=n) as manager:
        drained = asyncio.Event()
        done = 0

        async def consume(index: int) -> None:
            nonlocal done
            sub = manager.subscribe("mem", index, producer=lambda: producer)
            count = 0
            async for _ in sub:
                if index == 0 and count == 0:
                    sub.bind()  # never confirmed: event 0, and the lane behind it, stay
                count += 1
                if count == n:
                    break
            done += 1
            if done == s:
                drained.set()
            await asyncio.Event().wait()

        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        tasks = [asyncio.create_task(consume(i)) for i in range(s)]
        await drained.wait()
        gc.collect()
        [stats] = manager.stats()
        assert stats.outstanding == n, stats
        held = tracemalloc.get_traced_memory()[0] - before
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return held, stats.outstanding


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 4, 20, 100])
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 16, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the traced-memory runs")
    parser.add_argument(
        "--event-ids", action="store_true", help="ack mode with event ids (redelivery memory)"
    )
    parser.add_argument("--quick", action="store_true", help="N=5000, S in {1, 20}, repeat 1")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.subscribers, args.repeat = 5000, [1, 20], 1
    n = args.events

    header = (
        f"{'shape':<12}{'S':>4}{'L':>6}  {'floor µs':>9}  {'fast µs':>8} {'x':>5}"
        f"  {'ack µs':>8} {'x':>5}  {'ack peak MiB':>12}"
    )
    ids = args.event_ids
    print(
        f"N = {n:,} events per cell; µs per subscriber delivery, best of {args.repeat}"
        + ("; ack mode with event ids" if ids else "")
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    by_lanes: dict[tuple[str, int, int], float] = {}
    for shape in ("burst", "interleaved"):
        interleaved = shape == "interleaved"
        for s in args.subscribers:
            deliveries = n * s
            floor = timed(partial(run_floor, n, s, interleaved), args.repeat) / deliveries * 1e6
            fast = timed(partial(run_fast, n, s, interleaved), args.repeat) / deliveries * 1e6
            for lanes in args.lanes:
                ack_run = partial(run_ack, n, s, interleaved, lanes, ids)
                ack = timed(ack_run, args.repeat) / deliveries * 1e6
                memory = "-" if args.no_memory else f"{peak_memory(ack_run) / 2**20:.1f}"
                worst = max(worst, ack / floor)
                by_lanes[(shape, s, lanes)] = ack
                print(
                    f"{shape:<12}{s:>4}{lanes:>6}  {floor:>9.3f}  {fast:>8.3f} {fast / floor:>5.2f}"
                    f"  {ack:>8.3f} {ack / floor:>5.2f}  {memory:>12}"
                )
    print(f"\nworst ack-mode ratio to the floor: {worst:.2f}x (target <= 2.0)")
    low, high = min(args.lanes), max(args.lanes)
    lane_ratio = max(
        by_lanes[(shape, s, high)] / by_lanes[(shape, s, low)]
        for shape in ("burst", "interleaved")
        for s in args.subscribers
    )
    print(f"worst L={high} / L={low} ratio: {lane_ratio:.2f}x (target <= 1.3)")
    if not args.no_memory:
        for s in (1, 100):
            tracemalloc.start()
            held, outstanding = asyncio.run(outstanding_memory(n, s))
            tracemalloc.stop()
            print(
                f"S={s:>3}: {outstanding:,} outstanding events hold {held / 2**20:.2f} MiB"
                f" = {held / outstanding:.0f} bytes per outstanding event"
            )


if __name__ == "__main__":
    main()
