"""A three-handler ``ackgate.Service`` on Kafka for the Service crash test (issue 13).

    python service_consumer.py BOOTSTRAP TOPIC GROUP DLQ WORKDIR

Messages are ``b"<n>"`` (valid) or anything else (malformed). Handlers (the roster):

* ``indexer`` (batch, ``batch_size=200``) stores every valid message in
  ``WORKDIR/index.db`` (SQLite, committed before the batch returns);
* ``auditor`` raises ``Reject("malformed: not an integer")`` on malformed messages;
* ``notifier`` (``concurrency=4``, ``Retry(attempts=3)``) fails deterministically per
  (message, call): for ``n % 50 == 7`` (2 % of messages) its first ``failures(n)``
  calls in this process raise, ``failures(n)`` in 1..4. So 1 or 2 failures succeed
  on a retry; 3 or 4 exhaust the three attempts and the message is handed to the
  notifier again in-process after its redelivery backoff (short here: the notifier
  keeps its lane in order, so each wait holds that partition for it), and a later
  call succeeds.

Every handler appends ``"<partition> <offset>\\n"`` to ``WORKDIR/<handler>.log`` per
message it acked (the indexer after its SQLite commit). SIGTERM stops the service
gracefully and writes ``service.stats()`` to ``WORKDIR/stats.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from collections import Counter
from pathlib import Path

from ackgate import Message, Redelivery, Reject, Retry, Service
from ackgate_kafka import KafkaStreamProducer


class NotifierError(Exception):
    """The notifier failing one call, on purpose."""


def number(body: bytes) -> int | None:
    try:
        return int(body)
    except ValueError:
        return None


def failures(n: int) -> int:
    """How many first calls of the notifier fail for message ``n`` (0 for 98 %)."""
    return 1 + (n // 50) % 4 if n % 50 == 7 else 0


def position(message: Message) -> tuple[int, int]:
    return message.raw.partition, message.raw.offset


def build(bootstrap: str, topic: str, group: str, dlq: str, workdir: Path) -> Service:
    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            dlq_topic=dlq,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    service = Service("service-crash", producer=make, restart_backoff=0.5)
    logs = {
        sid: os.open(workdir / f"{sid}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for sid in ("indexer", "auditor", "notifier")
    }
    db = sqlite3.connect(workdir / "index.db")
    db.execute(
        "CREATE TABLE IF NOT EXISTS events "
        "(partition INTEGER, offset INTEGER, n INTEGER, PRIMARY KEY (partition, offset))"
    )
    db.commit()
    calls: Counter[str] = Counter()

    def done(sid: str, messages: list[Message]) -> None:
        os.write(logs[sid], "".join("{} {}\n".format(*position(m)) for m in messages).encode())

    @service.handler("indexer", batch_size=200, batch_wait=0.02)
    async def indexer(messages: list[Message]) -> None:
        rows = [(*position(m), n) for m in messages if (n := number(m.body)) is not None]
        db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?)", rows)
        db.commit()
        done("indexer", messages)

    @service.handler("auditor")
    async def auditor(message: Message) -> None:
        if number(message.body) is None:
            raise Reject("malformed: not an integer")
        done("auditor", [message])

    @service.handler(
        "notifier",
        concurrency=4,
        retry=Retry(attempts=3, backoff=0.01, max_backoff=0.05),
        redelivery=Redelivery(backoff=0.05, max_backoff=0.2),
    )
    async def notifier(message: Message) -> None:
        calls[message.id] += 1
        n = number(message.body)
        if n is not None and calls[message.id] <= failures(n):
            raise NotifierError(f"{message.id} call {calls[message.id]}")
        done("notifier", [message])

    return service


async def main(bootstrap: str, topic: str, group: str, dlq: str, workdir: Path) -> None:
    service = build(bootstrap, topic, group, dlq, workdir)
    stopping: list[asyncio.Task[None]] = []

    def on_term() -> None:
        stopping.append(asyncio.ensure_future(service.stop()))

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)
    await service.run()
    await asyncio.gather(*stopping)
    (workdir / "stats.json").write_text(
        json.dumps({h: vars_of(s) for h, s in service.stats().handlers.items()})
    )


def vars_of(stats: object) -> dict[str, int]:
    fields = ("handled", "rejected", "failed", "retried")
    return {f: getattr(stats, f) for f in fields}


if __name__ == "__main__":
    bootstrap, topic, group, dlq, workdir = sys.argv[1:6]
    asyncio.run(main(bootstrap, topic, group, dlq, Path(workdir)))
