"""What a service's supervision does when the broker refuses its producer.

An :class:`~ackgate.AuthenticationFailed` (credentials refused, access denied) or
:class:`~ackgate.TLSVerificationFailed` that ended a group is no outage: a reconnect
would be refused the same way. By default supervision raises it, as any
:class:`~ackgate.PermanentError` (docs/production.md#permanent-errors-and-exit-codes);
with ``retry_on_auth_error=SECONDS`` it starts the group again every ``SECONDS``
(credentials being rotated), logging the refusal once, and once more only when its
reason changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable

from ackgate._contract.checks import check_number
from ackgate._contract.errors import AuthenticationFailed, TLSVerificationFailed

Refusal = AuthenticationFailed | TLSVerificationFailed

logger = logging.getLogger("ackgate.service")


def refusal_in(cause: BaseException) -> Refusal | None:
    """The broker's refusal that ended the group (in ``cause``'s ``__cause__`` chain), if
    that is what ended it."""
    error: BaseException | None = cause
    while error is not None:
        if isinstance(error, AuthenticationFailed | TLSVerificationFailed):
            return error
        error = error.__cause__
    return None


class Refusals:
    """One service's refusals. Caller: ``Service`` (built in ``__init__``, which
    ``ValueError`` s a ``retry_every`` other than ``None`` or seconds > 0;
    :meth:`raise_or_wait` from supervision).

    ``reason`` is the reason of the refusal being retried, ``None`` once a group
    ended otherwise (supervision resets it): what ``ServiceStats.refused`` shows.
    """

    def __init__(self, key: Hashable, retry_every: float | None) -> None:
        if retry_every is not None:
            retry_every = check_number(
                "retry_on_auth_error", retry_every, minimum=0, inclusive=False
            )
        self._key = key
        self._retry_every = retry_every
        self.reason: str | None = None

    async def raise_or_wait(self, refusal: Refusal, stopping: asyncio.Event) -> None:
        """Raise ``refusal`` (with a note naming the service), or wait the retry
        interval (cut short by ``stopping``). Cancellation propagates."""
        if self._retry_every is None:
            refusal.add_note(
                f"service {self._key!r}: the broker refused it, not retried (a service made "
                "with retry_on_auth_error=SECONDS retries it)"
            )
            raise refusal
        if refusal.reason != self.reason:
            logger.warning(
                "service %r: %s%s; retrying every %gs (retry_on_auth_error)",
                self._key,
                refusal.reason,
                f" at {refusal.address}" if refusal.address else "",
                self._retry_every,
            )
        self.reason = refusal.reason
        try:
            async with asyncio.timeout(self._retry_every):
                await stopping.wait()
        except TimeoutError:
            pass
