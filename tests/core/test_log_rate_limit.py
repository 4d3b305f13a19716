"""``ackgate run``'s log rate limiting (docs/failure-semantics.md#broker-outages): one line per
logger and message template per interval, with a count of what was suppressed."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ackgate._operating.log_throttle import RateLimitFilter, rate_limit_logging


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(name: str, template: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, template, args, None)


def test_a_flood_becomes_one_line_per_interval_with_the_suppressed_count() -> None:
    clock = Clock()
    limiter = RateLimitFilter(10.0, clock)
    passed = []
    for n in range(81):  # aiokafka's per-retry ERRORs, one every 1/8 s for 10 s
        clock.now = 100.0 + n / 8
        line = record("aiokafka", "Unable connect to node with id %s: %s", 1, f"retry {n}")
        if limiter.filter(line):
            passed.append(line.getMessage())
    assert passed == [
        "Unable connect to node with id 1: retry 0",
        "Unable connect to node with id 1: retry 80 (79 similar lines suppressed in the last 10s)",
    ]


def test_templates_and_loggers_are_limited_separately() -> None:
    clock = Clock()
    limiter = RateLimitFilter(10.0, clock)
    assert limiter.filter(record("aiokafka", "Failed fetch messages from %s: %s", 1, "x"))
    assert limiter.filter(record("aiokafka", "Heartbeat failed: %r", "x"))
    assert limiter.filter(record("aiokafka.conn", "Failed fetch messages from %s: %s", 1, "x"))
    assert not limiter.filter(record("aiokafka", "Heartbeat failed: %r", "y"))
    clock.now += 10.0
    again = record("aiokafka", "Heartbeat failed: %r", "z")
    assert limiter.filter(again)
    assert again.getMessage() == (
        "Heartbeat failed: 'z' (1 similar lines suppressed in the last 10s)"
    )
    after_quiet = record("aiokafka", "Failed fetch messages from %s: %s", 1, "x")
    clock.now += 10.0
    assert limiter.filter(after_quiet)
    assert after_quiet.getMessage() == "Failed fetch messages from 1: x"  # nothing suppressed


def test_ackgate_s_own_lines_are_never_limited() -> None:
    """Each names one message (id, attempt), one outage or one restart: an operator
    searching for a message id must find its line."""
    limiter = RateLimitFilter(10.0, Clock())
    template = "handler %r failed on message id=%s (attempt %d)"
    for name in ("ackgate", "ackgate.service"):
        lines = [record(name, template, "indexer", f"orders/0/{n}", 3) for n in range(5)]
        assert all(limiter.filter(line) for line in lines)
    assert limiter.filter(record("ackgatex", template, "a", "b", 1))
    assert not limiter.filter(record("ackgatex", template, "a", "c", 1))


@pytest.fixture
def root_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Handler]:
    """A handler on the root logger; every limiter the test adds is taken off again
    (pytest's capture handlers are on the root logger too)."""
    root = logging.getLogger()
    handler = logging.NullHandler()
    monkeypatch.setattr(root, "level", root.level)
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        for each in root.handlers:
            for limiter in [f for f in each.filters if isinstance(f, RateLimitFilter)]:
                each.removeFilter(limiter)


def test_rate_limit_logging_filters_the_root_handlers_unless_debug(
    root_handler: logging.Handler,
) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    rate_limit_logging()
    assert not root_handler.filters  # DEBUG asked for every line
    logging.getLogger().setLevel(logging.INFO)
    rate_limit_logging()
    assert [type(f) for f in root_handler.filters] == [RateLimitFilter]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be a finite number > 0"):
        RateLimitFilter(0)
