"""What a rejected message is dead-lettered with: :data:`DEAD_LETTER_REASON` and an
``error_description`` naming how many subscribers rejected it and why.

When this happens is documented with the producer, in :mod:`ackgate_servicebus._producer`.
"""

from __future__ import annotations

from typing import Final

from ackgate import AdvanceOutcome

DEAD_LETTER_REASON: Final = "ackgate-rejected"
"""The ``reason`` given to ``dead_letter_message`` for a rejected event."""

_DESCRIPTION_LIMIT: Final = 4096
"""Characters of the ``error_description`` given to ``dead_letter_message``."""


def error_description(outcome: AdvanceOutcome) -> str:
    """``"rejected by R of N ackgate subscribers"``, then each reason given
    (docs/concepts.md#deferred-resolution), separated by ``"; "``, cut to 4096 characters."""
    total = outcome.acked + outcome.rejected
    why = "; ".join(
        (f"rejected by {outcome.rejected} of {total} ackgate subscribers", *outcome.reasons)
    )
    if len(why) > _DESCRIPTION_LIMIT:
        why = why[: _DESCRIPTION_LIMIT - 3] + "..."
    return why
