"""The low-level API under ``Service``: the quickstart's two handlers written with
``SharedStreamManager`` (``run_subscriber`` and a subscription iterated by hand).

Use it when handlers come and go at run time (a dynamic group), or when outputs are
bound to an event and confirmed later. Runs as is: ``python examples/low_level.py``.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ackgate import SharedStreamManager
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders", partitions=2)
orders = [
    ("alice", b'{"sku": "A1", "qty": 2}'),
    ("bob", b'{"sku": "B7", "qty": 1}'),
    ("carol", b'{"sku": "C3", "q'),  # torn: the auditor rejects it
    ("alice", b'{"sku": "D4", "qty": 5}'),
]
for customer, body in orders:
    broker.publish("orders", body, key=customer)  # one customer, one partition, in order

database: list[dict[str, Any]] = []


async def save(order: dict[str, Any]) -> None:
    database.append(order)  # your durable write goes here


async def index(events: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """Yield what to store; ackgate binds it to the event, awaits save(), then confirms."""
    async for raw in events:
        try:
            yield json.loads(raw)
        except ValueError:
            continue  # nothing to store; moving on acks the event


async def audit(manager: SharedStreamManager, producer: Callable[[], MemoryStreamProducer]) -> None:
    """The lower-level API: iterate a subscription yourself."""
    async with manager.subscribe("orders", "auditor", producer=producer) as events:
        async for raw in events:
            try:
                json.loads(raw)
            except ValueError:
                events.reject()  # the broker dead-letters it (orders.dlq)


async def main() -> None:
    def producer() -> MemoryStreamProducer:
        return MemoryStreamProducer(broker, "orders", "low-level")

    async with SharedStreamManager() as manager:
        handlers = [
            asyncio.create_task(
                manager.run_subscriber("orders", "indexer", index, producer=producer, sink=save)
            ),
            asyncio.create_task(audit(manager, producer)),
        ]
        # A service runs until it is stopped; this one stops once every event is
        # committed (or dead-lettered).
        await broker.wait_drained("orders", "low-level")
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    print("stored:", database)
    print("dead-lettered:", [record.value for record in broker.records("orders.dlq")])
    print("committed offsets:", broker.committed("orders", "low-level"))


if __name__ == "__main__":
    asyncio.run(main())
