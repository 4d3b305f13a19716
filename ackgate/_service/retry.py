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
