"""Rejected messages sent to ``dlq_queue_url``: the record (original body and message
attributes plus :data:`REASON_ATTRIBUTE`) and the batch send.

When this happens, and what happens without a ``dlq_queue_url``, is documented with the
producer, in :mod:`ackgate_sqs._producer`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ackgate import AdvanceOutcome
from ackgate_sqs._batches import chunks, failed_ids, submit
from ackgate_sqs._message import Receipt

logger = logging.getLogger("ackgate.adapters.sqs")

REASON_ATTRIBUTE = "ackgate.reason"
"""Message attribute naming why a message was dead-lettered through ``dlq_queue_url``."""

ORIGINAL_QUEUE_ATTRIBUTE = "ackgate.original.queue"
"""Message attribute naming the queue a dead letter came from (``ackgate dlq replay``
sends it back there); left out when the message has no room (SQS allows 10)."""

_REASON_LIMIT = 4096  # characters of ackgate.reason
_MAX_ATTRIBUTES = 10


async def dead_letter(
    client: Any,
    dlq_url: str,
    dead: Sequence[tuple[Receipt, AdvanceOutcome]],
    source_url: str | None = None,
) -> tuple[list[Receipt], list[Receipt]]:
    """Send rejected messages to the DLQ; return (sent, not sent)."""
    reasons = {
        id(receipt): _with_reasons(
            f"rejected by {o.rejected} of {o.acked + o.rejected} subscribers", o
        )
        for receipt, o in dead
    }
    receipts = [receipt for receipt, _ in dead]
    unsent: list[Receipt] = []
    for chunk in chunks(receipts):
        failures = await submit(
            client.send_message_batch,
            dlq_url,
            chunk,
            lambda r: _entry(r, reasons[id(r)], dlq_url, source_url),
        )
        if failures:
            logger.error(
                "SQS could not send message ids %s to the dead-letter queue; "
                "releasing them for redelivery",
                failed_ids(failures),
            )
            unsent.extend(r for r, _ in failures)
    failed = {id(r) for r in unsent}
    return [r for r in receipts if id(r) not in failed], unsent


def _with_reasons(summary: str, outcome: AdvanceOutcome) -> str:
    """``summary``, then the rejecting subscribers' reasons (docs/concepts.md#deferred-resolution),
    capped in length."""
    text = "; ".join((summary, *outcome.reasons))
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 3] + "..."


def _entry(
    receipt: Receipt, reason: str, dlq_url: str, source_url: str | None = None
) -> dict[str, Any]:
    message = receipt.message
    attributes = {
        name: {
            key: value[key] for key in ("DataType", "StringValue", "BinaryValue") if key in value
        }
        for name, value in message.get("MessageAttributes", {}).items()
    }
    attributes[REASON_ATTRIBUTE] = {"DataType": "String", "StringValue": reason}
    if source_url is not None and len(attributes) < _MAX_ATTRIBUTES:
        attributes[ORIGINAL_QUEUE_ATTRIBUTE] = {"DataType": "String", "StringValue": source_url}
    entry: dict[str, Any] = {"MessageBody": message["Body"], "MessageAttributes": attributes}
    if dlq_url.endswith(".fifo"):
        group = message.get("Attributes", {}).get("MessageGroupId", receipt.message_id)
        entry["MessageGroupId"] = group
        # A redelivered message that is rejected again is not dead-lettered twice.
        entry["MessageDeduplicationId"] = receipt.message_id
    return entry
