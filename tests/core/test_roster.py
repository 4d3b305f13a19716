"""docs/concepts.md#snapshot-and-roster: declared handlers (roster). No event is advanced without
every member."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Hashable
from typing import Any

import pytest

from ackgate import AckTimeout, SharedStreamManager, Subscription
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import outcomes, turn

ROSTER = ("indexer", "auditor", "notifier")


class CountingProducer(ScriptedProducer):
    """Counts the items its stream yielded: how often the group pulled it."""

    def __init__(self) -> None:
        super().__init__()
        self.yielded = 0

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        async for item in super().open_stream():
            self.yielded += 1
            yield item


@pytest.fixture
def counting() -> CountingProducer:
    return CountingProducer()


def join(
    manager: SharedStreamManager,
    producer: ScriptedProducer,
    members: tuple[Hashable, ...] = ROSTER,
) -> dict[Hashable, Subscription]:
    return {
        member: manager.subscribe("k", member, producer=lambda: producer, roster=ROSTER)
        for member in members
    }


# -- subscribe() arguments ----------------------------------------------------------


async def test_roster_arguments_are_checked(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    def make() -> ScriptedProducer:
        return producer

    with pytest.raises(ValueError, match="empty"):
        manager.subscribe("k", "a", producer=make, roster=[])
    with pytest.raises(ValueError, match="not in the roster"):
        manager.subscribe("k", "z", producer=make, roster=["a", "b"])
    with pytest.raises(ValueError, match="collection"):
        manager.subscribe("k", "a", producer=make, roster="ab")
    with pytest.raises(ValueError, match="hashable"):
        manager.subscribe("k", "a", producer=make, roster=["a", ["b"]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="fast path"):
        manager.subscribe("k", "a", source=producer.open_stream, roster=["a"])
    assert manager.stats() == []  # nothing was created by a refused subscribe


async def test_every_subscribe_passes_an_equal_roster(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    manager.subscribe("k", "indexer", producer=lambda: producer, roster=ROSTER)
    with pytest.raises(ValueError, match="differs"):
        manager.subscribe("k", "auditor", producer=lambda: producer, roster=["indexer", "auditor"])
    with pytest.raises(ValueError, match="pass its roster"):
        manager.subscribe("k", "auditor", producer=lambda: producer)
    # Equal as a set: order and duplicates do not matter.
    again = [*reversed(ROSTER), "auditor"]
    manager.subscribe("k", "auditor", producer=lambda: producer, roster=again)
    manager.subscribe("dyn", "a", producer=lambda: producer)
    with pytest.raises(ValueError, match="dynamic"):
        manager.subscribe("dyn", "b", producer=lambda: producer, roster=["a", "b"])


# -- starting ------------------------------------------------------------------------


async def test_polling_starts_only_once_every_member_is_attached(
    clock: FakeClock, counting: CountingProducer
) -> None:
    made = 0

    def make() -> CountingProducer:
        nonlocal made
        made += 1
        return counting

    # cohort_grace_period does not apply to rostered groups.
    async with SharedStreamManager(clock=clock, cohort_grace_period=3600.0) as manager:
        counting.feed("a", 0)
        subs = [manager.subscribe("k", m, producer=make, roster=ROSTER) for m in ROSTER[:2]]
        await turn()
        assert made == 0 and counting.yielded == 0
        (stats,) = manager.stats()
        assert stats.paused and stats.missing == ("notifier",)
        subs.append(manager.subscribe("k", "notifier", producer=make, roster=ROSTER))
        assert [await anext(sub) for sub in subs] == ["a", "a", "a"]
        assert made == 1
        (stats,) = manager.stats()
        assert not stats.paused and stats.missing == ()
        for sub in subs:
            await sub.aclose()
    assert outcomes(counting)[0].acked == 3


async def test_dynamic_groups_are_never_paused(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    manager.subscribe("k", "a", producer=lambda: producer)
    (stats,) = manager.stats()
    assert not stats.paused and stats.missing == ()


# -- pausing and resuming ------------------------------------------------------------


async def test_a_missing_member_pauses_the_group_and_its_return_resumes_it(
    manager: SharedStreamManager, counting: CountingProducer, caplog: pytest.LogCaptureFixture
) -> None:
    subs = join(manager, counting)
    counting.feed("a", 0)
    assert [await anext(sub) for sub in subs.values()] == ["a", "a", "a"]
    caplog.set_level(logging.INFO, logger="ackgate")
    async with asyncio.timeout(5):
        await subs["notifier"].__aexit__(RuntimeError, RuntimeError("boom"), None)
    paused = [r for r in caplog.records if "paused" in r.getMessage()]
    assert len(paused) == 1 and paused[0].levelno == logging.WARNING
    assert "notifier" in paused[0].getMessage()

    for n in range(1, 4):
        counting.feed(f"e{n}", n)
    await turn(50)
    # At most the one event the poll had already pulled is held; nothing is broadcast.
    assert counting.yielded <= 2
    (stats,) = manager.stats()
    assert stats.paused and stats.missing == ("notifier",)
    waiting = asyncio.ensure_future(anext(subs["indexer"]))
    await turn()
    assert not waiting.done()

    subs["notifier"] = manager.subscribe("k", "notifier", producer=lambda: counting, roster=ROSTER)
    assert await waiting == "e1"
    resumed = [r for r in caplog.records if "resumed" in r.getMessage()]
    assert len(resumed) == 1 and resumed[0].levelno == logging.INFO
    assert await anext(subs["notifier"]) == "e1"
    assert await anext(subs["auditor"]) == "e1"
    for sub in subs.values():
        assert await anext(sub) == "e2"
    await counting.wait_advanced(2)
    result = outcomes(counting)
    # The notifier crashed on event 0: failed, so the producer holds it for redelivery.
    assert (result[0].acked, result[0].failed) == (2, 1)
    assert (result[1].acked, result[1].failed) == (3, 0)


async def test_no_hot_loop_while_a_member_is_missing(
    manager: SharedStreamManager, counting: CountingProducer
) -> None:
    subs = join(manager, counting, ROSTER[:2])
    for n in range(100):
        counting.feed(n, n)
    await turn(500)
    assert counting.yielded == 0  # polling never started
    subs["notifier"] = manager.subscribe("k", "notifier", producer=lambda: counting, roster=ROSTER)
    for sub in subs.values():
        assert await anext(sub) == 0
    await subs["auditor"].aclose()
    await turn(500)
    pulled = counting.yielded
    await turn(500)
    assert counting.yielded == pulled <= 100  # nothing pulled while paused


async def test_queued_events_of_a_leaving_member_fail_so_their_lanes_hold(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    subs = join(manager, producer)
    for n in range(3):
        producer.feed(n, n)
    for sub in (subs["indexer"], subs["auditor"]):
        for n in range(3):
            assert await anext(sub) == n
    assert await anext(subs["notifier"]) == 0
    await subs["notifier"].aclose()  # clean leave: done with 0; 1 and 2 never handed out
    for sub in (subs["indexer"], subs["auditor"]):
        await sub.aclose()
    result = outcomes(producer)
    assert result[0].is_clean
    assert not result[1].is_clean and result[1].failed == 1
    assert not result[2].is_clean and result[2].failed == 1


async def test_an_ack_timeout_pauses_until_the_member_subscribes_again(
    clock: FakeClock, producer: ScriptedProducer
) -> None:
    async with SharedStreamManager(clock=clock, ack_timeout=10.0) as manager:
        subs = join(manager, producer)
        producer.feed("a", 0)
        for sub in subs.values():
            assert await anext(sub) == "a"
        waiting = {m: asyncio.ensure_future(anext(subs[m])) for m in ("indexer", "auditor")}
        await turn()  # both moved past "a"
        clock.advance(11.0)
        with pytest.raises(AckTimeout, match="paused"):
            await anext(subs["notifier"])
        (stats,) = manager.stats()
        assert stats.paused and stats.missing == ("notifier",)
        assert stats.failed_subscribers == 1
        producer.feed("b", 1)
        await turn()
        assert not any(w.done() for w in waiting.values())
        with pytest.raises(ValueError, match="already subscribed"):
            manager.subscribe("k", "notifier", producer=lambda: producer, roster=ROSTER)
        await subs["notifier"].aclose()
        subs["notifier"] = manager.subscribe(
            "k", "notifier", producer=lambda: producer, roster=ROSTER
        )
        assert [await w for w in waiting.values()] == ["b", "b"]
        assert await anext(subs["notifier"]) == "b"
        for sub in subs.values():
            await sub.aclose()
    result = outcomes(producer)
    assert (result[0].acked, result[0].failed) == (2, 1)
    assert result[1].is_clean and result[1].acked == 3


async def test_overflow_never_force_fails_a_member(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(
        clock=clock, subscriber_queue_size=2, overflow="fail"
    ) as manager:
        subs = join(manager, producer)
        for n in range(20):
            producer.feed(n, n)
        fast = [subs["indexer"], subs["auditor"]]

        async def read(sub: Subscription) -> list[Any]:
            return [await anext(sub) for _ in range(20)]

        readers = [asyncio.ensure_future(read(sub)) for sub in fast]
        await turn(100)
        assert not any(r.done() for r in readers)  # held back by the slow notifier
        assert manager.stats()[0].failed_subscribers == 0
        assert await read(subs["notifier"]) == list(range(20))
        assert [await r for r in readers] == [list(range(20))] * 2
        for sub in subs.values():
            await sub.aclose()
    assert all(outcome.is_clean and outcome.acked == 3 for outcome in outcomes(producer).values())
    assert len(outcomes(producer)) == 20


async def test_the_group_stops_when_every_member_left(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    subs = join(manager, producer)
    producer.feed("a", 0)
    for sub in subs.values():
        await anext(sub)
    for sub in subs.values():
        await sub.aclose()
    assert producer.closed == 1
    assert manager.stats() == []


async def test_run_subscriber_passes_the_roster_through(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    seen: dict[str, list[Any]] = {"a": [], "b": []}

    def handler(name: str) -> Any:
        async def handle(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for raw in events:
                seen[name].append(raw)
                yield raw

        return handle

    roster = ("a", "b")
    runners = [
        asyncio.ensure_future(
            manager.run_subscriber(
                "k", name, handler(name), producer=lambda: producer, roster=roster
            )
        )
        for name in roster
    ]
    producer.feed("x", 0)
    producer.feed("y", 1)
    producer.feed("z", 2)
    await producer.wait_advanced(3)  # both pulled past "z" and wait for more
    assert seen == {"a": ["x", "y", "z"], "b": ["x", "y", "z"]}
    assert [outcome.acked for outcome in outcomes(producer).values()] == [2, 2, 2]
    for runner in runners:
        runner.cancel()
    await asyncio.gather(*runners, return_exceptions=True)


async def test_a_clean_leave_warns_only_if_the_pause_lasts(
    manager: SharedStreamManager,
    clock: FakeClock,
    producer: ScriptedProducer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ackgate")
    subs = join(manager, producer)
    await subs["notifier"].aclose()
    await turn()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert manager.stats()[0].paused  # paused at once, only the warning waits
    clock.advance(1.0)
    await turn()
    paused = [r for r in caplog.records if "paused" in r.getMessage()]
    assert len(paused) == 1 and paused[0].levelno == logging.WARNING
    assert "notifier" in paused[0].getMessage()


async def test_a_service_leaving_member_by_member_logs_no_warning(
    manager: SharedStreamManager,
    clock: FakeClock,
    producer: ScriptedProducer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ackgate")
    subs = join(manager, producer)
    producer.feed("a", 0)
    for sub in subs.values():
        assert await anext(sub) == "a"
    for sub in subs.values():
        await sub.aclose()
    clock.advance(1.0)
    await turn()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert outcomes(producer)[0].acked == 3
