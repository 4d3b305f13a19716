"""The service each consumer host runs: ``ackgate run hostservice:service --workers 2``.

Three handlers read one topic through one Kafka consumer group. Each appends one line
per delivery to a file of its own process (``$MH_RECORDS/<host>-<pid>.log``), with
``O_APPEND`` and before it returns: a line is in the file before its offset can be
committed, and it stays there when the process is SIGKILLed. A line is

    <handler> <partition> <offset> <key> <seq> <time_ns>

where ``<seq>`` is the message's place among its key's messages (the body is
``<key> <seq>``). The driver reads the files to count deliveries, duplicates and the
order per key. ``indexer`` and ``notifier`` take a partition's messages one at a time
(``ordering="lane"``); ``auditor`` runs up to 8 calls at once, one per key at a time
(``ordering="key"``).
"""

from __future__ import annotations

import os
import time

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer

_records = os.open(
    os.path.join(os.environ["MH_RECORDS"], f"{os.environ['MH_HOST']}-{os.getpid()}.log"),
    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    0o644,
)


def _producer() -> KafkaStreamProducer:
    return KafkaStreamProducer(
        os.environ["MH_TOPIC"],
        bootstrap_servers=os.environ["MH_BOOTSTRAP"],
        group_id=os.environ["MH_GROUP"],
        rebalance_drain_timeout=5.0,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        request_timeout_ms=10000,
        retry_backoff_ms=200,
    )


service = Service("multihost", producer=_producer, restart_backoff=0.5)


def _record(handler: str, message: Message) -> None:
    raw = message.raw
    key, seq = message.body.split()
    line = (
        f"{handler} {raw.partition} {raw.offset} {key.decode()} {seq.decode()} {time.time_ns()}\n"
    )
    os.write(_records, line.encode())


@service.handler("indexer", ordering="lane")
async def indexer(message: Message) -> None:
    _record("indexer", message)


@service.handler("auditor", ordering="key", concurrency=8)
async def auditor(message: Message) -> None:
    _record("auditor", message)


@service.handler("notifier", ordering="lane")
async def notifier(message: Message) -> None:
    _record("notifier", message)
