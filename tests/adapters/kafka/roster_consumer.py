"""A three-handler rostered consumer service for the roster crash test (issue 12).

    python roster_consumer.py BOOTSTRAP TOPIC GROUP DLQ WORKDIR

Handlers, the group's roster, with ``SharedStreamManager()`` defaults:

* ``indexer`` stores each valid message (value ``b"<n>"``) in ``WORKDIR/index.db``
  (SQLite, committed before the output is confirmed) and skips malformed ones;
* ``auditor`` rejects malformed messages (they go to DLQ) and is slow: 2 ms per
  message, so its queue fills up (without a roster it would overflow);
* ``notifier`` raises on 0.2 % of its calls, then subscribes again after 1 s.

Every handler appends ``"<partition> <offset>\\n"`` per delivery to
``WORKDIR/<handler>.log``. SIGTERM stops it cleanly and writes the group's stats to
``WORKDIR/stats.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from ackgate import SharedStreamManager
from ackgate_kafka import KafkaStreamProducer

ROSTER = frozenset({"indexer", "auditor", "notifier"})
AUDIT_SECONDS = 0.002
NOTIFIER_FAILURE_RATE = 0.002
BACKOFF_SECONDS = 1.0


class NotifierError(Exception):
    """The notifier failing one call."""


def valid(value: bytes) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def open_index(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE IF NOT EXISTS events "
        "(partition INTEGER, offset INTEGER, n INTEGER, PRIMARY KEY (partition, offset))"
    )
    db.commit()
    return db


async def main(bootstrap: str, topic: str, group: str, dlq: str, workdir: Path) -> None:
    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            dlq_topic=dlq,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    logs = {
        sid: os.open(workdir / f"{sid}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for sid in ROSTER
    }
    db = open_index(workdir / "index.db")
    rng = random.Random(os.getpid())

    def delivered(sid: str, record: Any) -> None:
        os.write(logs[sid], f"{record.partition} {record.offset}\n".encode())

    async def indexer() -> None:
        async with manager.subscribe(topic, "indexer", producer=make, roster=ROSTER) as sub:
            async for record in sub:
                delivered("indexer", record)
                n = valid(record.value)
                if n is None:
                    continue
                seq = sub.bind()
                db.execute(
                    "INSERT OR IGNORE INTO events VALUES (?, ?, ?)",
                    (record.partition, record.offset, n),
                )
                db.commit()
                manager.confirm_persisted([seq] if seq is not None else [])

    async def auditor() -> None:
        async with manager.subscribe(topic, "auditor", producer=make, roster=ROSTER) as sub:
            async for record in sub:
                delivered("auditor", record)
                await asyncio.sleep(AUDIT_SECONDS)
                if valid(record.value) is None:
                    sub.reject()

    async def notifier() -> None:
        while True:
            try:
                async with manager.subscribe(
                    topic, "notifier", producer=make, roster=ROSTER
                ) as sub:
                    async for record in sub:
                        delivered("notifier", record)
                        if rng.random() < NOTIFIER_FAILURE_RATE:
                            raise NotifierError(record.offset)
            except NotifierError:
                await asyncio.sleep(BACKOFF_SECONDS)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with SharedStreamManager() as manager:
        tasks = [asyncio.create_task(handler()) for handler in (indexer, auditor, notifier)]
        await stop.wait()
        stats = [
            {
                "advance_calls": s.advance_calls,
                "advanced_events": s.advanced_events,
                "redeliveries_skipped": s.redeliveries_skipped,
            }
            for s in manager.stats()
        ]
        (workdir / "stats.json").write_text(json.dumps(stats))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    bootstrap, topic, group, dlq, workdir = sys.argv[1:6]
    asyncio.run(main(bootstrap, topic, group, dlq, Path(workdir)))
