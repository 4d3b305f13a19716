"""The queue's approximate counts, read every :data:`COUNTS_INTERVAL` seconds.

One ``GetQueueAttributes`` call per interval, whatever the number of messages:
``ApproximateNumberOfMessages`` (visible: waiting for a consumer) and
``ApproximateNumberOfMessagesNotVisible`` (in flight: received by some consumer and
not deleted yet). SQS says both are approximate (eventually consistent, about a
minute behind at worst). A call that fails keeps the last counts: the receive loop
reports an outage. Read through ``SqsStreamProducer.broker_lag()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ackgate import BrokerLag

logger = logging.getLogger("ackgate.adapters.sqs")

#: Seconds between two reads of the queue's counts.
COUNTS_INTERVAL = 10.0
_ATTRIBUTES = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]


class QueueCounts:
    """Reads ``queue_url``'s approximate counts with ``client``; :attr:`last` is the latest.

    Caller: ``SqsStreamProducer`` (``start()`` once connected, ``close()`` in ``aclose``).
    """

    def __init__(self, client: Any, queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url
        #: The latest counts; ``None`` until the first read.
        self.last: BrokerLag | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ackgate-sqs-queue-counts")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(COUNTS_INTERVAL):
                    self.last = await self.read()
            except Exception as exc:  # counts must never end the group
                logger.debug("SQS queue counts not read queue=%s: %r", self._queue_url, exc)
            await asyncio.sleep(COUNTS_INTERVAL)

    async def read(self) -> BrokerLag:
        """One ``GetQueueAttributes`` call (cancelled with the task)."""
        reply = await self._client.get_queue_attributes(
            QueueUrl=self._queue_url, AttributeNames=_ATTRIBUTES
        )
        attributes = reply.get("Attributes", {})
        return BrokerLag(
            waiting=int(attributes.get(_ATTRIBUTES[0], 0)),
            in_flight=int(attributes.get(_ATTRIBUTES[1], 0)),
            measured_at=time.time(),
        )
