"""What a service's process knows about earlier deliveries of a message, for the
``give_up_after`` rule "handed with ``attempt > give_up_after``: give up without a
call" (see ``Calls._give_up_unresolved``).

``Message.attempt - 1`` deliveries came before this one. Those made before this
process first saw the message are unknown: the process may have stopped while a
handler was on them (a crash loop), so each counts as a call that never resolved.
Those made since are known: a handler's call on it was cut short (the ack timeout,
a stop, a restart) or it was not (it was never called: it waited in a queue that
was dropped, or behind a hung message). Only the calls cut short count, so a message
that merely waited behind a hung one is not given up without ever being called.
"""

from __future__ import annotations

from ackgate._contract.deliveries import DeliveryCounts
from ackgate._contract.message import Message

_REMEMBERED = 65_536


class UnresolvedCalls:
    """Per service: first attempts seen per message id, and calls cut short per
    handler and message id, each for the ``_REMEMBERED`` most recent ids.

    Forgetting an id only makes the rule assume the worst for it (every earlier
    delivery a call that never resolved), as for a message seen first now.
    """

    __slots__ = ("_cut", "_first", "_order")

    def __init__(self) -> None:
        #: Invariant: the keys of ``_first`` are exactly the items of ``_order``, oldest
        #: first, at most ``2 * _REMEMBERED`` of them.
        self._first: dict[str, int] = {}
        self._order: list[str] = []
        self._cut = DeliveryCounts(_REMEMBERED)

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

    def cut_short(self, handler_id: str, message: Message) -> None:
        """Caller: a handler's calls, when a call on ``message`` ended unresolved."""
        self._cut.add((handler_id, message.id))

    def count(self, handler_id: str, message: Message) -> int:
        """Earlier deliveries of ``message`` to count as calls of ``handler_id`` that
        never resolved: those before this process saw it, plus the calls cut short."""
        attempt = message.attempt
        assert attempt is not None
        before = self._first.get(message.id, attempt) - 1
        return before + self._cut.get((handler_id, message.id))
