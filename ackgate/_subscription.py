"""One subscriber's view of a group: an async iterator of raw events with a window.

The subscription owns its per-subscriber state: its cursor into the group's
fan-out log, the event it is on (its open window) and the bindings of outputs it
derived. State shared by every subscriber (the log, the lanes, the resolution
counts) belongs to the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ackgate._bindings import Binding

if TYPE_CHECKING:
    from ackgate._group import Group
    from ackgate._log import Event

logger = logging.getLogger("ackgate.subscription")

#: The subscription whose event the current task was last handed.
_current_subscription: ContextVar[Subscription | None] = ContextVar(
    "ackgate_current_subscription", default=None
)


def reject_shared_stream_event() -> None:
    """Reject the event the calling task is on: it resolves as ``rejected`` at once.

    Call it from the task iterating the subscription (or from code that task
    awaits). Outside an ack-mode window it logs a warning and does nothing; on an
    event already resolved for this subscriber it does nothing.
    """
    subscription = _current_subscription.get()
    if subscription is None:
        logger.warning("reject_shared_stream_event() called outside a shared stream window")
        return
    subscription.reject()


class Subscription:
    """A subscriber's membership in a group; iterate it to receive raw events.

    Each ``async for`` step closes the window on the previous event and opens one
    on the next. Leave with ``async with`` so a crash is seen: exiting with an
    exception (cancellation included) fails the event you are on, exiting cleanly
    (or :meth:`aclose`) means you are done with it.
    """

    def __init__(self, group: Group, subscriber_id: Hashable, position: int) -> None:
        self._group = group
        self.key: Hashable = group.key
        self.subscriber_id = subscriber_id
        #: First stream position whose snapshot includes this subscriber.
        self._joined_at = position
        #: Next stream position to hand out. Invariant: ``_joined_at <= _cursor <= log.head``.
        self._cursor = position
        #: The event whose window is open, if any.
        self._current: Event | None = None
        #: Whether this subscriber's part in ``_current`` is already resolved.
        self._current_resolved = False
        self._current_binding: Binding | None = None
        #: Unresolved bindings by event, the open window's included.
        self._bindings: dict[Event, Binding] = {}
        #: Set when force-failed: what the next pull raises.
        self._failure: Exception | None = None
        self._left = False
        self._waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<Subscription key={self.key!r} subscriber_id={self.subscriber_id!r}>"

    # -- iteration ---------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Any:
        """Close the window on the current event and hand out the next one.

        Raises ``AckTimeout`` / ``SubscriberOverflow`` once force-failed,
        ``StreamTerminated`` / ``AdvanceFailed`` once the group ended, and
        ``StopAsyncIteration`` after the subscription was closed. Cancellation
        while waiting hands out nothing and changes nothing.
        """
        group = self._group
        if self._left:
            raise StopAsyncIteration
        if group.ack_mode:
            group.check_timeouts()
            current = self._current
            if current is not None:
                self._close_window(current)
        log = group.log
        while True:
            if self._failure is not None:
                raise self._failure
            if group.terminal is not None:
                raise group.terminal_error()
            if self._cursor < log.head:
                break
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            group.waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiter = None
            if self._left:
                raise StopAsyncIteration
        event = log.at(self._cursor)
        self._cursor += 1
        event.undelivered -= 1
        if event.undelivered == 0:
            log.trim()
        if group.blocked:
            group.room.set()
        if group.ack_mode:
            self._current = event
            self._current_resolved = False
            _current_subscription.set(self)
        return event.raw

    def _close_window(self, event: Event) -> None:
        self._current = None
        binding = self._current_binding
        self._current_binding = None
        if self._current_resolved:
            return
        if binding is None:
            self._group.resolve(event, "acked")
        elif binding.outstanding == 0:
            del self._bindings[event]
            self._group.resolve(event, "acked")
        else:
            binding.window_open = False

    def _binding_settled(self, binding: Binding) -> None:
        """Caller: the binding registry, when a closed window's last output is confirmed."""
        del self._bindings[binding.event]
        self._group.resolve(binding.event, "acked")
        if self._left and not self._bindings:
            self._group.departed.discard(self)

    # -- binding and rejecting ---------------------------------------------------

    def bind(self) -> int | None:
        """Bind one derived output to the open window; return its sequence number.

        Pass the number to ``manager.confirm_persisted`` once the output is stored.
        Returns ``None`` outside ack mode, outside a window, or when this
        subscriber's part in the open event is already resolved.
        """
        event = self._current
        if event is None or self._current_resolved:
            return None
        binding = self._current_binding
        if binding is None:
            binding = self._current_binding = self._bindings[event] = Binding(self, event)
        return self._group.bindings.bind(binding)

    def reject(self) -> None:
        """Resolve the open event as ``rejected`` now; nothing bound to it counts any more.

        Outside an ack-mode window: a warning, nothing else. On an event already
        resolved for this subscriber: nothing.
        """
        event = self._current
        if event is None or self._left:
            logger.warning(
                "reject() outside an ack-mode window key=%r subscriber_id=%r",
                self.key,
                self.subscriber_id,
            )
            return
        if self._current_resolved:
            return
        self._current_resolved = True
        binding = self._current_binding
        if binding is not None:
            self._current_binding = None
            del self._bindings[event]
            self._group.bindings.forget(binding)
        self._group.resolve(event, "rejected")

    # -- leaving -----------------------------------------------------------------

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._leave(crashed=exc_type is not None)

    async def aclose(self) -> None:
        """Leave cleanly: done with the current event; queued events fail.

        If this was the group's last subscriber, returns after the group stopped
        (final advances done, producer closed). Cancellation while waiting for
        that does not interrupt the group's shutdown. Idempotent.
        """
        await self._leave(crashed=False)

    async def _leave(self, *, crashed: bool) -> None:
        stop = self._group.leave(self, crashed=crashed)
        if stop is not None:
            await asyncio.shield(stop)
