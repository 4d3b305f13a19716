"""A three-handler ``ackgate.Service`` on Kafka for the broker outage test
(docs/failure-semantics.md#broker-outages), run with ``ackgate run outage_service:service`` from
this directory.

Configured by the environment: ``OUTAGE_BOOTSTRAP``, ``OUTAGE_TOPIC``,
``OUTAGE_GROUP``, ``OUTAGE_WORKDIR`` and ``OUTAGE_WORK_SECONDS`` (time the indexer
spends per message, which paces the run so the broker can go away in the middle
of it). Every handler appends ``"<partition> <offset>\\n"`` to
``OUTAGE_WORKDIR/<handler>.log`` per message before returning (one unbuffered
``O_APPEND`` write: stored before it is acked), so the test can check that nothing
was committed before all three handlers finished it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer

BOOTSTRAP = os.environ["OUTAGE_BOOTSTRAP"]
TOPIC = os.environ["OUTAGE_TOPIC"]
GROUP = os.environ["OUTAGE_GROUP"]
WORKDIR = Path(os.environ["OUTAGE_WORKDIR"])
WORK_SECONDS = float(os.environ.get("OUTAGE_WORK_SECONDS", "0.001"))


def make() -> KafkaStreamProducer:
    return KafkaStreamProducer(
        TOPIC,
        bootstrap_servers=BOOTSTRAP,
        group_id=GROUP,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )


# A small max_outstanding keeps most of the topic unfetched when the broker goes away.
service = Service("outage", producer=make, restart_backoff=0.5, max_outstanding=256)
logs = {
    handler: os.open(WORKDIR / f"{handler}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for handler in ("indexer", "auditor", "notifier")
}


def done(handler: str, message: Message) -> None:
    os.write(logs[handler], f"{message.raw.partition} {message.raw.offset}\n".encode())


@service.handler("indexer")
async def indexer(message: Message) -> None:
    await asyncio.sleep(WORK_SECONDS)
    done("indexer", message)


@service.handler("auditor", concurrency=4)
async def auditor(message: Message) -> None:
    done("auditor", message)


@service.handler("notifier", concurrency=4)
async def notifier(message: Message) -> None:
    done("notifier", message)
