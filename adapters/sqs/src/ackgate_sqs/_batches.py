"""SQS batch calls (``DeleteMessageBatch``, ``ChangeMessageVisibilityBatch``,
``SendMessageBatch``): at most ten entries a call, failed entries retried, and the
messages of concurrent advances merged into shared calls (:class:`Coalescer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from ackgate_sqs._message import Receipt

BATCH_LIMIT = 10  # SQS takes at most ten entries per batch call (and per receive)
_ATTEMPTS = 3
_RETRY_DELAY = 0.2
# Entry codes meaning the receipt handle no longer names an in-flight message:
# retrying cannot help, and SQS redelivers the message on its own.
_STALE_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)

BatchCall = Callable[..., Awaitable[dict[str, Any]]]


def chunks(receipts: Sequence[Receipt]) -> Iterator[Sequence[Receipt]]:
    for start in range(0, len(receipts), BATCH_LIMIT):
        yield receipts[start : start + BATCH_LIMIT]


def failed_ids(failures: Sequence[tuple[Receipt, str]]) -> str:
    """Message ids and error codes, for a log line (never a body)."""
    return ", ".join(f"{receipt.message_id} ({code})" for receipt, code in failures)


async def submit(
    call: BatchCall,
    queue_url: str,
    chunk: Sequence[Receipt],
    entry: Callable[[Receipt], dict[str, Any]],
) -> list[tuple[Receipt, str]]:
    """Run one batch call (at most ten entries), retrying failed entries.

    Returns the entries that still failed, with their error codes. Stale
    receipt handles are not retried. A failing call raises.
    """
    pending = {str(index): receipt for index, receipt in enumerate(chunk)}
    failures: list[tuple[Receipt, str]] = []
    for attempt in range(_ATTEMPTS):
        entries = [{"Id": key, **entry(r)} for key, r in pending.items()]
        response = await call(QueueUrl=queue_url, Entries=entries)
        errors = {e["Id"]: str(e.get("Code", "?")) for e in response.get("Failed", ())}
        retry = {}
        for key, code in errors.items():
            if code in _STALE_CODES or attempt == _ATTEMPTS - 1:
                failures.append((pending[key], code))
            else:
                retry[key] = pending[key]
        if not retry:
            break
        pending = retry
        await asyncio.sleep(_RETRY_DELAY * 2**attempt)
    return failures


class Coalescer:
    """Merges the messages of concurrent :meth:`SqsStreamProducer.advance` calls
    into batch calls of up to ten.

    On a standard queue every message is its own lane, so each advance carries a
    single message; with ``max_concurrent_advances`` above 1 the advances running
    at the same time share one batch call instead of paying one request each.
    A caller returns once its own messages were sent; an error of the call they
    shared is raised in every caller.
    """

    def __init__(self, send: Callable[[Sequence[Receipt]], Awaitable[None]]) -> None:
        self._send = send
        self._waiting: list[tuple[Receipt, asyncio.Future[None]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def submit(self, receipts: Sequence[Receipt]) -> None:
        if not receipts:
            return
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in receipts]
        self._waiting.extend(zip(receipts, futures, strict=True))
        if self._sender is None:
            self._sender = loop.create_task(self._send_waiting())
        await asyncio.gather(*futures)

    async def _send_waiting(self) -> None:
        try:
            await asyncio.sleep(0)  # let the advances started in this pass join in
            while self._waiting:
                chunk = self._waiting[:BATCH_LIMIT]
                del self._waiting[:BATCH_LIMIT]
                try:
                    await self._send([receipt for receipt, _ in chunk])
                except Exception as exc:
                    for _, future in chunk:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for _, future in chunk:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._sender = None
            # Only reached with messages left if this task was cancelled (loop
            # shutdown): their advances must not wait forever.
            for _, future in self._waiting:
                future.cancel()
            self._waiting.clear()
