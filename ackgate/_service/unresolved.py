"""A handler's own count of its hand-outs of a message: ``Message.attempt`` as that
handler sees it, and the ``give_up_after`` rules built on it (``Calls``).

A handler sees ``attempt = before + unresolved + 1`` where ``before`` is
``Message.attempt - 1`` of the first delivery of the message this process saw (the
broker's or the adapter's count: the process may have stopped while a handler was
on each of those deliveries, a crash loop, so each counts as a call that never
resolved) and ``unresolved`` the hand-outs of it to this handler in this process
that ended without an ack or a reject: the call failed (after its ``Retry``) or was
cut short (the ack timeout, a stop, a restart). A delivery that never reached the
handler (it waited in a queue that was dropped, or behind a hung message) counts
nothing, and neither does another handler's failure: the count is per handler,
exact in calls (docs/failure-semantics.md#redelivery-to-the-failing-handler).
"""

from __future__ import annotations

from ackgate._contract.deliveries import DeliveryCounts
from ackgate._contract.message import Message

_REMEMBERED = 65_536


class UnresolvedCalls:
    """Per service: first attempts seen per message id, and hand-outs that ended
    unresolved per handler and message id, each for the ``_REMEMBERED`` most recent ids.

    Forgetting an id only makes the count start again from the broker's attempt for
    it, as for a message seen first now.
    """

    __slots__ = ("_ended", "_first", "_order")

    def __init__(self) -> None:
        #: Invariant: the keys of ``_first`` are exactly the items of ``_order``, oldest
        #: first, at most ``2 * _REMEMBERED`` of them.
        self._first: dict[str, int] = {}
        self._order: list[str] = []
        self._ended = DeliveryCounts(_REMEMBERED)

    def seen(self, message: Message) -> None:
        """Caller: the service's conversion, once per delivery of ``message``."""
        attempt = message.attempt
        if attempt is None or message.id in self._first:
            return
        self._first[message.id] = attempt
        self._order.append(message.id)
        if len(self._order) > 2 * _REMEMBERED:  # amortised: trim in one step
            for forgotten in self._order[:-_REMEMBERED]:
                del self._first[forgotten]
            del self._order[:-_REMEMBERED]

    def ended_unresolved(self, handler_id: str, message: Message) -> None:
        """Caller: a handler's calls, when a hand-out of ``message`` failed or was cut
        short."""
        self._ended.add((handler_id, message.id))

    def attempt(self, handler_id: str, message: Message) -> int | None:
        """``message.attempt`` as ``handler_id`` sees it on its next hand-out (``None``
        when the producer counts no attempts)."""
        attempt = message.attempt
        if attempt is None:
            return None
        return self._first.get(message.id, attempt) + self._ended.get((handler_id, message.id))
