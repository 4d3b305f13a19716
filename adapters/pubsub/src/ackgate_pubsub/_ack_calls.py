"""Calls that take ack ids (acknowledge, nack, lease): cut to the request limit, and on
exactly-once subscriptions per-ack-id failures retried (transient) or returned (permanent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from ackgate_pubsub._errors import PubSubError

# An ack/modack request is capped at 512 KiB and an ack id runs to a few hundred bytes.
_ACK_IDS_PER_CALL = 1000
_EOD_ATTEMPTS = 3

AckCall = Callable[[list[str]], Awaitable[None]]


async def run_ack_call(
    subscription: str, what: str, call: AckCall, ack_ids: list[str]
) -> dict[str, str]:
    """Run ``call`` over ``ack_ids`` in chunks; return the ids refused for good, with why.

    Per-ack-id failures exist on exactly-once subscriptions only: transient ones
    are retried, permanent ones returned. Any other failure raises
    :class:`PubSubError` (``what`` on ``subscription`` failed).
    """
    # Imported here, not at the top: importing the adapter must not need the SDK, and
    # this runs only once the producer has connected.
    from google.api_core import exceptions as gexc

    refused: dict[str, str] = {}
    for start in range(0, len(ack_ids), _ACK_IDS_PER_CALL):
        pending = ack_ids[start : start + _ACK_IDS_PER_CALL]
        for attempt in range(_EOD_ATTEMPTS):
            try:
                await call(pending)
                pending = []
                break
            except gexc.GoogleAPIError as exc:
                per_ack = _per_ack_failures(exc, pending)
                if per_ack is None:
                    raise PubSubError(f"{what} on {subscription} failed: {exc}") from exc
                retry = [a for a in pending if per_ack.get(a, "").startswith("TRANSIENT_")]
                refused.update((a, per_ack[a]) for a in pending if a in per_ack and a not in retry)
                pending = retry
                if not pending:
                    break
                await asyncio.sleep(0.1 * 2**attempt)  # back off before retrying
        refused.update((a, "transient failures persisted") for a in pending)
    return refused


def _per_ack_failures(exc: Exception, ack_ids: list[str]) -> dict[str, str] | None:
    """The ack id -> failure reason map an exactly-once subscription sends, if this is one."""
    metadata = getattr(exc, "metadata", None)
    if not isinstance(metadata, Mapping) or not any(ack_id in metadata for ack_id in ack_ids):
        return None
    return {str(key): str(value) for key, value in metadata.items()}
