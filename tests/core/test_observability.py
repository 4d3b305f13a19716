"""docs/production.md#traces-and-logs: logging and stats()."""

from __future__ import annotations

import logging

import pytest

from ackgate import GroupStats, OldestOutstanding, SharedStreamManager
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import turn


async def test_one_info_line_per_group_start_and_one_on_stop(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    producer = ScriptedProducer()
    with caplog.at_level(logging.INFO, logger="ackgate"):
        async with SharedStreamManager(clock=clock) as manager:
            subs = [
                manager.subscribe(("orders", 1), i, producer=lambda: producer) for i in range(5)
            ]
            for sub in subs:
                await sub.aclose()
    started = [r for r in caplog.records if "group started" in r.getMessage()]
    stopped = [r for r in caplog.records if "group stopped" in r.getMessage()]
    assert [r.getMessage() for r in started] == ["Shared stream group started key=('orders', 1)"]
    assert len(stopped) == 1 and "last subscriber left" in stopped[0].getMessage()
    assert all(r.name.startswith("ackgate") for r in caplog.records)


async def test_stats_reports_each_live_group(clock: FakeClock) -> None:
    producer = ScriptedProducer(lane=lambda payload: payload % 3)
    async with SharedStreamManager(clock=clock) as manager:
        a = manager.subscribe("k", "a", producer=lambda: producer)
        b = manager.subscribe("k", "b", producer=lambda: producer)

        async def fast_source():  # type: ignore[no-untyped-def]
            while True:
                yield 1
                await turn(1)

        fast = manager.subscribe("f", "x", source=fast_source)
        for i in range(6):
            producer.feed(i, i)
        for _ in range(6):
            await anext(a)
        await anext(b)
        seq = b.bind()
        await anext(b)
        await turn()
        clock.advance(2.5)
        by_key = {s.key: s for s in manager.stats()}
        assert by_key["k"] == GroupStats(
            key="k",
            mode="ack",
            subscribers=2,
            outstanding=6,
            lanes=3,
            oldest_outstanding_age=2.5,
            advanced_events=0,
            advance_calls=0,
            failed_subscribers=0,
            # Event 0 is bound by "b" and not confirmed; "a" resolved it.
            oldest=OldestOutstanding(lane=0, age=2.5, holders=("b",), raw_event=0),
            # "a" holds the window on event 5; "b" owes 0 (bound), 1 (its window), 2..5.
            behind={"a": 1, "b": 6},
        )
        assert by_key["f"].mode == "fast" and by_key["f"].subscribers == 1
        assert by_key["f"].outstanding == 0
        manager.confirm_persisted([seq])
        await producer.wait_advanced(1)
        after = {s.key: s for s in manager.stats()}["k"]
        assert after.advanced_events == 1 and after.advance_calls == 1
        assert after.outstanding == 5
        assert after.oldest == OldestOutstanding(lane=1, age=2.5, holders=("b",), raw_event=1)
        assert after.behind == {"a": 1, "b": 5}
        for sub in (a, b, fast):
            await sub.aclose()
        assert manager.stats() == []


async def test_stats_age_is_zero_without_outstanding_events(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock) as manager:
        sub = manager.subscribe("k", "a", producer=lambda: producer)
        clock.advance(100)
        [stats] = manager.stats()
        assert stats.oldest_outstanding_age == 0.0 and stats.outstanding == 0
        await sub.aclose()
