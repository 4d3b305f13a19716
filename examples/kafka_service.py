"""An ackgate Service on Apache Kafka: every record goes to three handlers, and the
consumer group's offset is committed past it only once all three are done with it.

* ``indexer`` stores each JSON record in a SQLite database (committed before the
  handler returns, so a committed offset never passes an unstored record);
* ``auditor`` rejects records that are not JSON: they are copied to the DLQ topic with
  an ``ackgate.reason`` header naming the auditor's reason, then committed past;
* ``notifier`` stands for a side effect (here, a line on stdout), retried on errors.

Configured from the environment:

* ``ACKGATE_KAFKA_BOOTSTRAP`` (default ``localhost:9092``): the brokers.
* ``ACKGATE_KAFKA_TOPIC`` (default ``orders``) and ``ACKGATE_KAFKA_GROUP`` (default
  ``orders-service``): the topic to read and the consumer group that commits.
* ``ACKGATE_KAFKA_DLQ_TOPIC`` (default ``<topic>.dlq``): where rejected records go.
* ``ACKGATE_INDEX_DB`` (default ``index.db``): the indexer's SQLite file.

Run it from the repository root (``examples`` is imported as a namespace package from
the current directory)::

    ACKGATE_KAFKA_BOOTSTRAP=localhost:9092 ackgate run examples.kafka_service:service

or from this directory as ``ackgate run kafka_service:service``. SIGTERM or Ctrl-C
stops it gracefully: what was handled is committed, the rest is redelivered to the
group on the next start.
"""

import json
import os
import sqlite3

from ackgate import Message, Reject, Retry, Service
from ackgate_kafka import KafkaStreamProducer

BOOTSTRAP = os.environ.get("ACKGATE_KAFKA_BOOTSTRAP", "localhost:9092")
TOPIC = os.environ.get("ACKGATE_KAFKA_TOPIC", "orders")
GROUP = os.environ.get("ACKGATE_KAFKA_GROUP", "orders-service")
DLQ_TOPIC = os.environ.get("ACKGATE_KAFKA_DLQ_TOPIC", f"{TOPIC}.dlq")
INDEX_DB = os.environ.get("ACKGATE_INDEX_DB", "index.db")


def make_producer() -> KafkaStreamProducer:
    return KafkaStreamProducer(
        TOPIC, bootstrap_servers=BOOTSTRAP, group_id=GROUP, dlq_topic=DLQ_TOPIC
    )


service = Service("kafka-orders", producer=make_producer)

index = sqlite3.connect(INDEX_DB)
index.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
index.commit()


def parse(message: Message) -> object | None:
    try:
        document: object = json.loads(message.body)
    except ValueError:  # UnicodeDecodeError too
        return None
    return document


@service.handler("indexer", retry=Retry(attempts=3, backoff=0.1))
async def indexer(message: Message) -> None:
    document = parse(message)
    if document is None:
        return  # the auditor rejects it: it goes to the DLQ, not to the index
    # Keyed by the broker's id: a redelivered record overwrites its own row.
    index.execute("INSERT OR REPLACE INTO orders VALUES (?, ?)", (message.id, json.dumps(document)))
    index.commit()  # stored before returning: only then may the offset pass it


@service.handler("auditor")
async def auditor(message: Message) -> None:
    if parse(message) is None:
        raise Reject("malformed JSON")  # dead-lettered with this reason, never retried


@service.handler("notifier", concurrency=8, retry=Retry(attempts=3, backoff=0.1))
async def notifier(message: Message) -> None:
    # concurrency=8 with the default ordering="lane": partitions in parallel, each in order.
    print(f"notified {message.id}", flush=True)
