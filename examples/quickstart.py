"""ackgate quickstart: read a topic once, hand every message to two handlers, and commit
a message only when both are done with it.

Runs as is on the in-process broker: ``python examples/quickstart.py``. In a real
service, swap ``MemoryStreamProducer`` for the producer of your broker's adapter and
run the service with ``ackgate run quickstart:service`` (it stops on SIGTERM).
"""

import asyncio
import json
from typing import Any

from ackgate import Message, Reject, Retry, Service
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

service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "quickstart"))
database: list[dict[str, Any]] = []


@service.handler("indexer", concurrency=8, retry=Retry(attempts=3))  # in order per partition
async def index(message: Message) -> None:
    try:
        order = json.loads(message.body)
    except ValueError:
        return  # nothing to store; returning acks the message
    database.append(order)  # your durable write goes here; raising retries it


@service.handler("auditor")
async def audit(message: Message) -> None:
    try:
        json.loads(message.body)
    except ValueError:
        raise Reject("not JSON") from None  # the broker dead-letters it (orders.dlq)


async def main() -> None:
    running = asyncio.create_task(service.run())
    # A service runs until it is stopped; this one stops once every message is
    # committed (or dead-lettered).
    await broker.wait_drained("orders", "quickstart")
    await service.stop()
    await running

    print("stored:", database)
    print("dead-lettered:", [record.value for record in broker.records("orders.dlq")])
    print("committed offsets:", broker.committed("orders", "quickstart"))


if __name__ == "__main__":
    asyncio.run(main())
