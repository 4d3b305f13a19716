"""A consumer service for the crash test: run it, SIGKILL it, run it again.

    python crash_consumer.py BOOTSTRAP TOPIC GROUP SINK_DIR SUBSCRIBERS

Each of SUBSCRIBERS subscribers appends ``"<partition> <offset>\\n"`` per record to
``SINK_DIR/<subscriber>.log`` (one unbuffered O_APPEND write: persisted before it is
confirmed) with a little simulated work per record. SIGTERM stops it cleanly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ackgate import SharedStreamManager
from ackgate_kafka import KafkaStreamProducer

WORK_SECONDS = 0.0005


def file_sink(path: Path) -> Callable[[str], Any]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def sink(line: str) -> None:
        os.write(fd, line.encode())

    return sink


async def handle(records: AsyncIterator[Any]) -> AsyncIterator[str]:
    async for record in records:
        await asyncio.sleep(WORK_SECONDS)
        yield f"{record.partition} {record.offset}\n"


async def main(bootstrap: str, topic: str, group: str, sink_dir: Path, subscribers: int) -> None:
    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with SharedStreamManager(cohort_grace_period=0.5, overflow="block") as manager:
        runs = [
            asyncio.create_task(
                manager.run_subscriber(
                    topic,
                    f"sub-{i}",
                    handle,
                    producer=make,
                    sink=file_sink(sink_dir / f"sub-{i}.log"),
                )
            )
            for i in range(subscribers)
        ]
        await stop.wait()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


if __name__ == "__main__":
    bootstrap, topic, group, sink_dir, subscribers = sys.argv[1:6]
    asyncio.run(main(bootstrap, topic, group, Path(sink_dir), int(subscribers)))
