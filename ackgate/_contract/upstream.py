"""Whether a group's broker is reachable, as its producer reports it.

The producer reports (:meth:`SharedStreamProducer.upstream_lost` and
:meth:`~SharedStreamProducer.upstream_back`); this module logs and counts. An
outage is logged exactly twice, whatever the number of reports in between: one
WARNING when the upstream is lost, naming the broker address and the cause, and one
INFO when it is back. A client library's own per-retry errors are its business
(``ackgate run`` rate-limits them, :mod:`ackgate._operating.log_throttle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

logger = logging.getLogger("ackgate.upstream")


class Upstream:
    """One group's view of its broker connection (``GroupStats.upstream_*``).

    Invariant: ``down_since is None`` exactly when ``connected``; both change only
    in :meth:`lost` and :meth:`back`, each of which logs once per change
    (``tests/core/test_upstream.py``).
    """

    __slots__ = ("address", "cause", "connected", "down_since", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.connected = True
        #: Wall-clock time (``time.time()``) the current outage was first reported.
        self.down_since: float | None = None
        self.address = ""
        self.cause = ""

    def lost(self, address: str, cause: BaseException | str) -> None:
        """The producer cannot reach ``address``; a repeat during one outage is silent."""
        if not self.connected:
            return
        self.connected = False
        self.down_since = time.time()
        self.address = address
        self.cause = cause if isinstance(cause, str) else _describe(cause)
        logger.warning(
            "Upstream lost key=%r address=%s cause=%s: nothing is advanced until it is "
            "back; the producer keeps reconnecting",
            self.key,
            address,
            self.cause,
        )

    def back(self) -> None:
        """The producer reached its broker again; silent if it was not lost."""
        if self.connected:
            return
        assert self.down_since is not None
        down_for = max(0.0, time.time() - self.down_since)
        self.connected = True
        self.down_since = None
        logger.info(
            "Upstream back key=%r address=%s after %.1fs down",
            self.key,
            self.address,
            down_for,
        )


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
