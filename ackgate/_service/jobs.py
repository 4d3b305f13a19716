"""A handler call to make (:class:`Job`) and how it is named in log lines."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from ackgate._contract.message import Message

#: The ordering key of a job that waits for no other job.
UNORDERED: Any = object()


class Job:
    """One handler call to make: its argument, its messages and their tickets."""

    __slots__ = (
        "apart",
        "argument",
        "failures",
        "handed_at",
        "key",
        "messages",
        "resolved",
        "seqs",
        "shown",
        "sizes",
    )

    def __init__(
        self,
        argument: Any,
        messages: Sequence[Message],
        seqs: Sequence[int],
        key: Hashable,
        sizes: Sequence[int] | None = None,
    ) -> None:
        #: What the handler is called with: a Message, or a list of them (batches).
        self.argument = argument
        #: The messages as delivered (their broker attempt).
        self.messages = messages
        #: ``messages`` as the handler sees them on this hand-out: ``attempt`` is the
        #: handler's own count (:mod:`ackgate._service.unresolved`); same indexes.
        self.shown = messages
        #: The tickets of ``messages``: one per message, or with ``sizes`` one per
        #: batch binding (``Subscription.pull_batch``), ``sizes[i]`` messages each,
        #: in the same order.
        self.seqs = seqs
        self.sizes = sizes
        #: Jobs with an equal key run one at a time, in submission order.
        self.key = key
        #: Set once the tickets were resolved. Invariant: they are resolved exactly once.
        self.resolved = False
        #: Batch jobs: indexes of ``messages`` resolved before or between calls (given
        #: up on) and left out of ``argument``.
        self.apart: set[int] | None = None
        #: The manager's clock when the job was submitted (the ack timeout runs from
        #: about then), and the hand-outs of it that failed so far in this process.
        self.handed_at = 0.0
        self.failures = 0


def unresolved_reason(deliveries: int) -> str:
    return (
        f"gave up after {deliveries} attempts: not resolved by any of them "
        "(the process stopped or the call was cut short each time)"
    )


def describe(job: Job) -> str:
    """The job's message ids and delivery attempts for a log line, never their bodies."""
    messages = job.shown
    if len(messages) == 1:
        message = messages[0]
        if message.attempt is None:
            return f"message id={message.id}"
        return f"message id={message.id} (attempt {message.attempt})"
    attempts = [message.attempt for message in messages if message.attempt is not None]
    counted = f", attempts {min(attempts)}-{max(attempts)}" if attempts else ""
    return (
        f"a batch of {len(messages)} messages (ids {messages[0].id} .. {messages[-1].id}{counted})"
    )
