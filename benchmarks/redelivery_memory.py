"""Bytes per remembered event id in the redelivery memory (SPEC §13), measured.

A group remembers, for each of its last ``capacity`` acked event ids, which
subscribers acked it. This prints the traced bytes per id for the shapes the
adapters use: Kafka ``(topic, partition, offset)``, SQS / Pub/Sub message-id
strings, Service Bus sequence numbers, memory ``(partition, offset)``.

    python benchmarks/redelivery_memory.py [--ids 65536]
"""

from __future__ import annotations

import argparse
import tracemalloc
import uuid
from collections.abc import Callable, Hashable

from ackgate._redelivery import RedeliveryMemory

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=65_536)
    args = parser.parse_args()
    print(f"{args.ids:,} ids remembered, 3 subscribers each")
    print(f"{'id shape':36} bytes/id")
    for name, make_id in SHAPES.items():
        print(f"{name:36} {measure(make_id, args.ids):8.1f}")


if __name__ == "__main__":
    main()
