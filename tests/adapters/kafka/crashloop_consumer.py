"""A Service that dies on one message, for the crash-loop test
(docs/failure-semantics.md#poison-messages).

    python crashloop_consumer.py BOOTSTRAP TOPIC GROUP DLQ WORKDIR POISON [GIVE_UP_AFTER]

Handlers ``worker`` and ``auditor`` both log ``"<offset> <attempt>\\n"`` to
``WORKDIR/<handler>.log`` for every message they are called with; ``worker`` then
SIGKILLs its own process when the body is ``POISON`` (the process dies mid-handling:
no failure, no result). With ``GIVE_UP_AFTER``, ``worker`` has ``give_up_after`` set.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer


def main() -> None:
    bootstrap, topic, group, dlq, workdir, poison = sys.argv[1:7]
    give_up_after = int(sys.argv[7]) if len(sys.argv) > 7 else None

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            dlq_topic=dlq,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    service = Service("crashloop", producer=make)
    logs = {
        sid: os.open(Path(workdir) / f"{sid}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for sid in ("worker", "auditor")
    }

    def log(sid: str, message: Message) -> None:
        os.write(logs[sid], f"{message.raw.offset} {message.attempt}\n".encode())

    options = {} if give_up_after is None else {"give_up_after": give_up_after}

    @service.handler("worker", **options)
    async def worker(message: Message) -> None:
        log("worker", message)
        if message.body == poison.encode():
            os.kill(os.getpid(), signal.SIGKILL)

    @service.handler("auditor")
    async def auditor(message: Message) -> None:
        log("auditor", message)

    async def run() -> None:
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, lambda: asyncio.ensure_future(service.stop())
        )
        await service.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
