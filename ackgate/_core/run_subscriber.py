"""``run_subscriber``: bind, store and confirm every output a handler yields."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ackgate._core.subscription import Subscription

Handler = Callable[[Subscription], AsyncIterator[Any] | Awaitable[None]]
Sink = Callable[[Any], Awaitable[object]]


async def drive(
    subscription: Subscription,
    handle: Handler,
    sink: Sink | None,
    confirm: Callable[[tuple[int]], None],
) -> None:
    """Run ``handle`` over ``subscription`` until it returns or raises.

    Each output is bound to the event the handler is on when it yields, stored
    through ``sink`` and then confirmed, before the handler is resumed. Leaves the
    subscription on every exit: an exception or cancellation fails the open event.
    """
    async with subscription:
        outputs = handle(subscription)
        if inspect.isawaitable(outputs):  # a coroutine function: no outputs to persist
            await outputs
            return
        if not hasattr(outputs, "__anext__"):
            raise TypeError(
                "handle must be an async generator function (or a coroutine function) "
                f"taking the subscription; calling it returned {type(outputs).__name__}"
            )
        try:
            async for output in outputs:
                seq = subscription.bind()
                if sink is not None:
                    await sink(output)
                if seq is not None:
                    confirm((seq,))
        finally:
            aclose = getattr(outputs, "aclose", None)
            if aclose is not None:
                await aclose()
