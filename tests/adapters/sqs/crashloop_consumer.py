"""A Service that dies on every message it is handed, for the SQS crash-loop test.

    python crashloop_consumer.py ENDPOINT QUEUE_URL DLQ_URL WORKDIR GIVE_UP_AFTER

Handler ``deadly`` (``give_up_after=GIVE_UP_AFTER``) appends ``"<attempt>\\n"`` to
``WORKDIR/deadly.log``, then SIGKILLs its own process: no failure, no result, and no
release either, so SQS alone brings the message back (after ``visibility_timeout``)
and counts the receive. On SIGTERM the service stops and writes how many messages
``deadly`` gave up to ``WORKDIR/gave_up``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from ackgate import Message, Service
from ackgate_sqs import SqsStreamProducer

# A long poll shorter than the visibility timeout: a poll left in flight by the killed
# process has ended at the server before the message is visible again, so it cannot
# take (and count) a receive no handler ever sees.
WAIT_SECONDS = 1
VISIBILITY_SECONDS = 3


def main() -> None:
    endpoint, url, dlq, workdir, give_up_after = sys.argv[1:6]
    service = Service(
        "sqs",
        producer=lambda: SqsStreamProducer(
            url,
            region_name="us-east-1",
            endpoint_url=endpoint,
            dlq_queue_url=dlq,
            wait_time_seconds=WAIT_SECONDS,
            visibility_timeout=VISIBILITY_SECONDS,
        ),
    )
    log = os.open(Path(workdir) / "deadly.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @service.handler("deadly", give_up_after=int(give_up_after))
    async def deadly(message: Message) -> None:
        os.write(log, f"{message.attempt}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)

    async def run() -> None:
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, lambda: asyncio.ensure_future(service.stop())
        )
        await service.run()
        gave_up = service.stats().handlers["deadly"].gave_up
        (Path(workdir) / "gave_up").write_text(str(gave_up))

    asyncio.run(run())


if __name__ == "__main__":
    main()
