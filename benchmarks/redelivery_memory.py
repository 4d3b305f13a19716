"""Bytes per remembered event id in the redelivery memory (docs/concepts.md#redelivery-memory),
measured.

A group remembers, for each of its last ``capacity`` acked event ids, which
subscribers acked it. This prints the traced bytes per id for the shapes the
adapters use: Kafka ``(topic, partition, offset)``, SQS / Pub/Sub message-id
strings, Service Bus sequence numbers, memory ``(partition, offset)``, one cell
per id; and Kafka's fetched runs, whose offsets have no gap (``IdRange``), one span
per run of ``--run`` ids (the runs the Kafka adapter yields: up to 256 records of
one partition).

    python benchmarks/redelivery_memory.py [--ids 65536]
"""

from __future__ import annotations

import argparse
import tracemalloc
import uuid
from collections.abc import Callable, Hashable

from ackgate import IdRange
from ackgate._core.redelivery import RedeliveryMemory

SHAPES: dict[str, Callable[[int], Hashable]] = {
    "kafka (topic, partition, offset)": lambda n: ("orders", n % 16, 10**9 + n),
    "sqs/pubsub message id (str)": lambda n: str(uuid.UUID(int=n)),
    "servicebus sequence number (int)": lambda n: 10**12 + n,
    "memory (partition, offset)": lambda n: (n % 16, 10**6 + n),
}


def measure(make_id: Callable[[int], Hashable], ids: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    memory = RedeliveryMemory(capacity=ids)
    bits = [memory.bit(name) for name in ("indexer", "auditor", "notifier")]
    for n in range(ids):
        [cell] = memory.cells([make_id(n)])
        for bit in bits:
            assert bit is not None
            cell[0] |= 1 << bit  # what each subscriber's ack does
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(memory) == ids
    return (after - before) / ids


def measure_spans(ids: int, run: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    memory = RedeliveryMemory(capacity=ids)
    flags = [
        1 << bit for bit in map(memory.bit, ("indexer", "auditor", "notifier")) if bit is not None
    ]
    for first in range(0, ids, run):
        record = memory.remember(IdRange(("orders", first // run % 16), 10**9 + first, run))
        for flag in flags:
            record.ack(flag)  # what each subscriber's ack of the whole run does
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(memory) == ids
    return (after - before) / ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=65_536)
    parser.add_argument("--run", type=int, default=256, help="ids per Kafka run (spans)")
    args = parser.parse_args()
    print(f"{args.ids:,} ids remembered, 3 subscribers each")
    print(f"{'id shape':36} bytes/id")
    for name, make_id in SHAPES.items():
        print(f"{name:36} {measure(make_id, args.ids):8.1f}")
    spans = f"kafka runs of {args.run} (IdRange spans)"
    print(f"{spans:36} {measure_spans(args.ids, args.run):8.1f}")


if __name__ == "__main__":
    main()
