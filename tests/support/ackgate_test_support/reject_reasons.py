"""One message rejected with reasons by two of three subscribers
(docs/concepts.md#deferred-resolution), end to end.

Shared by every adapter's end-to-end test of the dead-letter record's reasons: the
scenario is the same on each broker, only how the record is read back differs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from ackgate import SharedStreamManager, SharedStreamProducer

#: The subscribers, in subscription order (the order of their ``subscribe`` calls).
SUBSCRIBERS = ("auditor", "parser", "indexer")
#: ``AdvanceOutcome.reasons`` of the message: subscription order, not the order in
#: which the rejects happened (the parser rejects first, the auditor last).
REASONS = ("auditor: schema v3 unsupported", "parser: bad json")


async def reject_with_reasons(
    key: Hashable, producer: Callable[[], SharedStreamProducer], **options: Any
) -> Any:
    """Run the scenario on the first message ``producer`` yields; return that raw event.

    ``auditor`` binds an output to the message; ``parser`` then rejects it with
    ``sub.reject(reason="bad json")``; ``indexer`` is handed it too; only then the
    auditor's bound output is rejected with ``manager.reject_bound([seq],
    reason="schema v3 unsupported")``. Everyone then leaves cleanly, which acks the
    message for ``indexer``. The last one to leave waits until the group stopped,
    so when this returns the message was advanced (dead-lettered) and the producer
    closed. ``options`` go to the ``SharedStreamManager``.
    """
    async with SharedStreamManager(**options) as manager:
        auditor, parser, indexer = (
            manager.subscribe(key, sid, producer=producer) for sid in SUBSCRIBERS
        )
        async with auditor, parser, indexer:
            raw = await anext(auditor)
            seq = auditor.bind()
            assert seq is not None
            assert await anext(parser) is raw
            parser.reject(reason="bad json")
            assert await anext(indexer) is raw
            manager.reject_bound([seq], reason="schema v3 unsupported")
    return raw
