"""Dead letters as ``ackgate dlq`` reads and replays them, whatever the broker.

An adapter makes its dead-letter destination readable by registering, under the
entry-point group :data:`DEAD_LETTER_GROUP` (its broker's name as the entry's name),
a callable ``open(destination, options) -> DeadLetterBox``: ``destination`` is the
DLQ's name (a Kafka topic, an SQS queue URL), ``options`` the ``-o KEY=VALUE`` pairs
of the command line (the connection: ``bootstrap_servers``, ``endpoint_url``...).
Nothing here imports an adapter (docs/dead-letters.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ackgate._contract.message import REPLAY_SERVICE_HEADER, REPLAY_TO_HEADER, REPLAYED_HEADER

#: The entry-point group of the adapters' :class:`DeadLetterBox` openers.
DEAD_LETTER_GROUP = "ackgate.dead_letters"

#: The header (attribute) naming the original message's id on a replayed copy, kept on
#: its dead-letter record when it is rejected again.
REPLAY_OF_HEADER = "ackgate.replay-of"

#: Header names ackgate writes; a replayed copy carries none of the old ones.
ACKGATE_PREFIX = "ackgate."


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter destination.

    Attributes:
        id: The dead-letter record's own id (Kafka ``dlq-topic/partition/offset``,
            SQS ``MessageId``): what ``ackgate dlq show`` and ``replay --id`` take.
        original_id: The id of the message that was rejected (for a replayed copy
            rejected again, of the first one it copies).
        source: Where it came from (Kafka: the original topic), ``""`` if unknown.
        reason: The dead-letter record's ``ackgate.reason``.
        rejections: ``(handler id, reason)`` per handler that rejected it, read from
            ``reason`` (:func:`rejections`).
        body: The original body.
        key: The original key, if any.
        headers: The original headers, without ackgate's own.
        replayed: How many times it was replayed before this record was written.
        raw: The adapter's native record.
    """

    id: str
    original_id: str
    source: str
    reason: str
    rejections: tuple[tuple[str, str], ...]
    body: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    replayed: int = 0
    raw: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(
        cls,
        *,
        id: str,
        original_id: str,
        source: str,
        body: bytes,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes],
        raw: Any = None,
    ) -> DeadLetter:
        """A dead-letter record as an adapter read it: ``headers`` are all of its headers
        (attributes); ackgate's own (``ackgate.reason``, the replay markers) are read
        and left out of :attr:`headers`. A replayed copy's ``ackgate.replay-of`` wins
        over ``original_id``."""
        items = list(headers.items() if isinstance(headers, Mapping) else headers)
        text = {name: value.decode(errors="replace") for name, value in items}
        reason = text.get("ackgate.reason", "")
        replayed = text.get(REPLAYED_HEADER, "0")
        return cls(
            id=id,
            original_id=text.get(REPLAY_OF_HEADER, original_id),
            source=source,
            reason=reason,
            rejections=rejections(reason),
            body=body,
            key=key,
            headers={n: v for n, v in items if not n.startswith(ACKGATE_PREFIX)},
            replayed=int(replayed) if replayed.isdigit() else 0,
            raw=raw,
        )

    @property
    def handlers(self) -> tuple[str, ...]:
        return tuple(handler for handler, _ in self.rejections)

    def replay_headers(self, handler: str | None, service: str | None = None) -> dict[str, bytes]:
        """The headers of its replayed copy: the original ones, the original id, the
        replay count, ``ackgate.replay-to`` when it is meant for ``handler`` only, and
        ``ackgate.replay-service`` when it is meant for the service of key ``service``
        only (the other consumers of the source ack it unseen)."""
        headers = dict(self.headers)
        headers[REPLAY_OF_HEADER] = self.original_id.encode()
        headers[REPLAYED_HEADER] = str(self.replayed + 1).encode()
        if handler is not None:
            headers[REPLAY_TO_HEADER] = handler.encode()
        if service is not None:
            headers[REPLAY_SERVICE_HEADER] = service.encode()
        return headers


def rejections(reason: str) -> tuple[tuple[str, str], ...]:
    """``(handler id, reason)`` pairs of an ``ackgate.reason`` text: ``"rejected by R of
    N subscribers"``, then ``"<handler id>: <reason>"`` per rejecting handler that gave
    one, separated by ``"; "`` (the first after ``": "`` on Kafka). A part that names no
    handler continues the reason before it."""
    _, sep, rest = reason.partition(" subscribers")
    if not sep:
        return ()
    rest = rest.removeprefix(":").removeprefix(";").strip()
    found: list[list[str]] = []
    for part in rest.split("; ") if rest else ():
        handler, colon, text = part.partition(": ")
        if colon and handler and " " not in handler:
            found.append([handler, text])
        elif found:
            found[-1][1] += "; " + part
    return tuple((handler, text) for handler, text in found)


class DeadLetterBox(Protocol):
    """One dead-letter destination, opened by an adapter for ``ackgate dlq``."""

    async def read(self) -> list[DeadLetter]:
        """Every dead letter it holds now, oldest first; nothing is removed."""

    async def replay(self, letter: DeadLetter, headers: Mapping[str, bytes]) -> None:
        """Send a copy of ``letter`` (its body and key) with ``headers`` to its source,
        then, where the broker removes what was read (SQS), remove it from the DLQ."""

    async def aclose(self) -> None:
        """Close the clients; best effort."""
