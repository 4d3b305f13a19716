"""How often, and how patiently, a :class:`~ackgate.Service` handler call is retried."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ackgate._contract.checks import check_int, check_number


@dataclass(frozen=True, slots=True)
class Retry:
    """The retry policy of a handler: ``Retry(attempts=3, backoff=0.1, max_backoff=5.0)``.

    ``attempts`` counts the first call (``Retry()`` is one call, no retry). Before
    retry *n* (n = 1, 2, ...) the handler waits ``min(max_backoff, backoff * 2**(n-1))``
    seconds, jittered down by up to half ("equal jitter"), so handlers that failed
    together do not retry in lockstep. Invalid values are a ``ValueError``.
    """

    attempts: int = 1
    backoff: float = 0.1
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        check_int("Retry.attempts (it counts the first call)", self.attempts, minimum=1)
        for name in ("backoff", "max_backoff"):
            check_number(f"Retry.{name}", getattr(self, name), minimum=0)
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"Retry.max_backoff ({self.max_backoff!r}) must be >= "
                f"Retry.backoff ({self.backoff!r})"
            )

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the second call)."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** min(retry - 1, 64))
        return ceiling / 2 + random.uniform(0.0, ceiling / 2)


@dataclass(frozen=True, slots=True)
class Redelivery:
    """How long a :class:`~ackgate.Service` waits before it hands a message again to
    the handler that failed it: ``Redelivery(backoff=1.0, max_backoff=60.0)``.

    A handler that fails a message (after every call its :class:`Retry` allows) is
    handed the same message again, in-process, after
    ``min(max_backoff, backoff * 2**(n-1))`` seconds for its *n*-th failure of it,
    jittered down by up to half (as :class:`Retry`). The defaults, 1 s doubling up to
    60 s, cost a message that fails forever about 5 calls in its first 30 s and one
    a minute after that. Invalid values are a ``ValueError``.
    """

    backoff: float = 1.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        for name in ("backoff", "max_backoff"):
            check_number(f"Redelivery.{name}", getattr(self, name), minimum=0)
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"Redelivery.max_backoff ({self.max_backoff!r}) must be >= "
                f"Redelivery.backoff ({self.backoff!r})"
            )

    def delay(self, failures: int) -> float:
        """Seconds to wait before handing a message again after its ``failures``-th
        failure (1 after the first)."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** min(failures - 1, 64))
        return ceiling / 2 + random.uniform(0.0, ceiling / 2)
