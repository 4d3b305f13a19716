"""Log rate limiting for ``ackgate run``: a client library's per-retry flood becomes a
few lines.

While a broker is down its client logs every failed retry (aiokafka: dozens of
ERROR lines a second). :class:`RateLimitFilter` lets through one record per
(logger, message template) per interval and counts the rest; the next record of
that template that goes through says how many were suppressed. ackgate's own
loggers (``ackgate`` and its children) are never limited: each of their lines is
about one event (a message that failed, with its id and attempt; one outage; one
restart), and an operator looking for a message id must find it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ackgate._contract.checks import check_number

#: Seconds between two records of one (logger, template) that both go through.
DEFAULT_INTERVAL = 10.0

#: Templates remembered at most; beyond it, windows with nothing suppressed and
#: already over are forgotten (a library logging pre-formatted text makes every
#: line a template of its own).
_MAX_TEMPLATES = 4096


class RateLimitFilter(logging.Filter):
    """Pass the first record of each (logger name, unformatted message) per
    ``interval`` seconds; drop and count the others of that window.

    The first record after a window in which some were dropped is passed with
    ``" (N similar lines suppressed in the last S s)"`` appended to its message.
    Records of ackgate's own loggers always pass. Attach it to a handler (it then
    sees records of every logger that reach it).
    """

    def __init__(
        self, interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval = check_number("interval", interval, minimum=0, inclusive=False)
        self._clock = clock
        #: (logger name, template) -> [window start, records suppressed in it].
        self._windows: dict[tuple[str, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == "ackgate" or name.startswith("ackgate."):
            return True
        key = (name, str(record.msg))
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window[0] < self.interval:
            window[1] += 1
            return False
        if window is None and len(self._windows) >= _MAX_TEMPLATES:
            self._forget(now)
        self._windows[key] = [now, 0]
        if window is not None and window[1]:
            record.msg = (
                f"{record.getMessage()} ({window[1]:.0f} similar lines suppressed "
                f"in the last {now - window[0]:.0f}s)"
            )
            record.args = None
        return True

    def _forget(self, now: float) -> None:
        for key, (start, suppressed) in list(self._windows.items()):
            if not suppressed and now - start >= self.interval:
                del self._windows[key]


def rate_limit_logging(interval: float = DEFAULT_INTERVAL) -> None:
    """Add a :class:`RateLimitFilter` to every handler of the root logger.

    Nothing is limited when the root logger is at DEBUG: whoever asked for every
    line gets every line.
    """
    root = logging.getLogger()
    if root.level <= logging.DEBUG:
        return
    limiter = RateLimitFilter(interval)
    for handler in root.handlers:
        handler.addFilter(limiter)
