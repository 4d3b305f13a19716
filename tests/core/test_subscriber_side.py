"""docs/concepts.md#window: subscribing, windows, binding, rejecting, leaving."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from ackgate import (
    AdvanceOutcome,
    SharedStreamManager,
    StreamTerminated,
    Subscription,
    reject_shared_stream_event,
)
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import outcomes, turn


async def one_output_moved_past(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> tuple[Subscription, int]:
    """Subscribe, bind one output to event 0 and move on to event 1: event 0 now
    waits for that output's confirmation only."""
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    producer.feed("a", 0)
    producer.feed("b", 1)
    await anext(sub)
    seq = sub.bind()
    assert seq is not None
    await anext(sub)
    return sub, seq


# -- subscribe() arguments ----------------------------------------------------------


async def test_subscribe_needs_exactly_one_of_producer_or_source(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        manager.subscribe("k", "s")
    with pytest.raises(ValueError, match="exactly one"):
        manager.subscribe(
            "k", "s", producer=lambda: producer, source=lambda: producer.open_stream()
        )


async def test_subscribe_rejects_none_and_unhashable_keys(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    with pytest.raises(ValueError, match="None"):
        manager.subscribe(None, "s", producer=lambda: producer)
    with pytest.raises(ValueError, match="hashable"):
        manager.subscribe(["k"], "s", producer=lambda: producer)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hashable"):
        manager.subscribe("k", {"id": 1}, producer=lambda: producer)  # type: ignore[arg-type]
    assert manager.stats() == []


async def test_duplicate_live_subscriber_is_refused_until_it_leaves(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    first = manager.subscribe("k", "s", producer=lambda: producer)
    other = manager.subscribe("k", "t", producer=lambda: producer)
    with pytest.raises(ValueError, match="already subscribed"):
        manager.subscribe("k", "s", producer=lambda: producer)
    await first.aclose()
    again = manager.subscribe("k", "s", producer=lambda: producer)
    await again.aclose()
    await other.aclose()


async def test_mode_mismatch_is_refused(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "a", producer=lambda: producer)
    with pytest.raises(ValueError, match="producer="):
        manager.subscribe("k", "b", source=lambda: producer.open_stream())
    await sub.aclose()


async def test_subscribe_after_manager_aclose_is_runtime_error(
    producer: ScriptedProducer,
) -> None:
    manager = SharedStreamManager()
    await manager.aclose()
    with pytest.raises(RuntimeError):
        manager.subscribe("k", "s", producer=lambda: producer)


def test_subscribe_needs_a_running_loop(producer: ScriptedProducer) -> None:
    with pytest.raises(RuntimeError):
        SharedStreamManager().subscribe("k", "s", producer=lambda: producer)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"ack_timeout": 0}, "ack_timeout"),
        ({"ack_timeout": -1.0}, "ack_timeout"),
        ({"ack_timeout": float("nan")}, "ack_timeout"),
        ({"ack_timeout": "5"}, "ack_timeout"),
        ({"subscriber_queue_size": 0}, "subscriber_queue_size"),
        ({"subscriber_queue_size": 1.5}, "subscriber_queue_size"),
        ({"subscriber_queue_size": True}, "subscriber_queue_size"),
        ({"cohort_grace_period": -0.1}, "cohort_grace_period"),
        ({"max_concurrent_advances": 0}, "max_concurrent_advances"),
        ({"overflow": "drop"}, "overflow"),
        ({"clock": 3.0}, "clock"),
    ],
)
def test_constructor_arguments_are_checked(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SharedStreamManager(**kwargs)


def test_constructor_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        SharedStreamManager(300.0)  # type: ignore[misc]


# -- snapshot, windows, resolution --------------------------------------------------


async def test_snapshot_at_fanout_excludes_later_subscribers(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    a = manager.subscribe("k", "a", producer=lambda: producer)
    producer.feed("first", 1)
    assert await anext(a) == "first"
    b = manager.subscribe("k", "b", producer=lambda: producer)
    producer.feed("second", 2)
    assert await anext(a) == "second"
    assert await anext(b) == "second"  # b never sees "first"
    await producer.wait_advanced(1)
    assert outcomes(producer)[1] == AdvanceOutcome(acked=1, failed=0, rejected=0)
    await a.aclose()
    await b.aclose()
    assert outcomes(producer)[2] == AdvanceOutcome(acked=2, failed=0, rejected=0)


async def test_pulling_the_next_event_resolves_the_previous_as_acked(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    for i in range(3):
        producer.feed(i, i)
    await anext(a)
    await anext(b)
    await anext(a)
    await turn()
    assert producer.batches == []  # b is still on event 0
    await anext(b)
    await producer.wait_advanced(1)
    assert outcomes(producer)[0] == AdvanceOutcome(2, 0, 0)
    await a.aclose()
    await b.aclose()


async def test_bound_outputs_hold_the_event_until_confirmed(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    producer.feed("a", 0)
    producer.feed("b", 1)
    await anext(sub)
    first, second = sub.bind(), sub.bind()
    assert isinstance(first, int) and isinstance(second, int) and first != second
    await anext(sub)  # window on "a" closes; two outputs still unconfirmed
    manager.confirm_persisted([first])
    await turn()
    assert producer.batches == []
    manager.confirm_persisted(iter([second]))
    await producer.wait_advanced(1)
    assert outcomes(producer)[0] == AdvanceOutcome(1, 0, 0)
    await sub.aclose()


async def test_confirm_persisted_works_from_another_thread(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub, seq = await one_output_moved_past(manager, producer)
    thread = threading.Thread(target=manager.confirm_persisted, args=([seq],))
    thread.start()
    await asyncio.to_thread(thread.join)
    await producer.wait_advanced(1)
    await sub.aclose()


async def test_confirm_persisted_ignores_garbage_and_refuses_non_iterables(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub, seq = await one_output_moved_past(manager, producer)
    manager.confirm_persisted([None, "x", 1.0, True, [seq], seq + 1000, -1])
    await turn()
    assert producer.batches == []
    with pytest.raises(TypeError):
        manager.confirm_persisted(seq)  # type: ignore[arg-type]
    manager.confirm_persisted(str(seq))  # an iterable of characters: nothing to confirm
    await turn()
    assert producer.batches == []
    manager.confirm_persisted([seq, seq])  # stale on the second go: ignored
    await producer.wait_advanced(1)
    await sub.aclose()


async def test_bind_returns_none_outside_a_window_and_after_reject(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    assert sub.bind() is None  # no window yet
    producer.feed("a", 0)
    await anext(sub)
    sub.reject()
    assert sub.bind() is None
    await sub.aclose()
    assert sub.bind() is None
    assert outcomes(producer)[0] == AdvanceOutcome(0, 0, 1)


async def test_reject_module_function_resolves_as_rejected_at_once(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    producer.feed("poison", 0)
    await anext(a)
    await anext(b)
    seq = a.bind()
    reject_shared_stream_event()  # the task was last handed b's event
    b.reject()  # already resolved: nothing happens
    a.reject()
    await producer.wait_advanced(1)
    assert outcomes(producer)[0] == AdvanceOutcome(acked=0, failed=0, rejected=2)
    manager.confirm_persisted([seq])  # a rejected event's output no longer counts
    await a.aclose()
    await b.aclose()


async def test_reject_outside_a_window_warns_and_does_nothing(
    manager: SharedStreamManager, producer: ScriptedProducer, caplog: pytest.LogCaptureFixture
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)

    async def elsewhere() -> None:
        reject_shared_stream_event()

    with caplog.at_level(logging.WARNING, logger="ackgate"):
        await asyncio.create_task(elsewhere())
        sub.reject()
    assert len([r for r in caplog.records if "outside" in r.getMessage()]) == 2
    await sub.aclose()


# -- leaving ------------------------------------------------------------------------


async def test_clean_leave_acks_current_and_fails_queued(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    for i in range(3):
        producer.feed(i, i)
    async with sub:
        await anext(sub)
        await turn()  # events 1 and 2 are queued, never handed out
    got = outcomes(producer)
    assert got[0] == AdvanceOutcome(1, 0, 0)
    assert got[1] == got[2] == AdvanceOutcome(0, 1, 0)


async def test_exit_with_exception_fails_the_current_event(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    producer.feed(0, 0)
    with pytest.raises(ZeroDivisionError):
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            await anext(sub)
            raise ZeroDivisionError
    assert outcomes(producer)[0] == AdvanceOutcome(0, 1, 0)


async def test_cancellation_counts_as_a_crash(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    handed = asyncio.Event()

    async def handler() -> None:
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            await anext(sub)
            handed.set()
            await asyncio.Event().wait()

    producer.feed(0, 0)
    task = asyncio.create_task(handler())
    await handed.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcomes(producer)[0] == AdvanceOutcome(0, 1, 0)


async def test_events_moved_past_keep_waiting_for_confirmation_after_leaving(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    stays = manager.subscribe("k", "stays", producer=lambda: producer)
    leaves = manager.subscribe("k", "leaves", producer=lambda: producer)
    producer.feed(0, 0)
    producer.feed(1, 1)
    await anext(leaves)
    seq = leaves.bind()
    await anext(leaves)
    with pytest.raises(RuntimeError):
        async with leaves:
            raise RuntimeError("crash on event 1")
    await anext(stays)
    await anext(stays)
    await turn()
    assert producer.batches == []  # event 0 waits for the departed subscriber's output
    manager.confirm_persisted([seq])
    await producer.wait_advanced(1)
    assert outcomes(producer)[0] == AdvanceOutcome(2, 0, 0)
    await stays.aclose()
    assert outcomes(producer)[1] == AdvanceOutcome(acked=1, failed=1, rejected=0)


async def test_last_subscriber_aclose_returns_after_group_stopped(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    producer.feed(0, 0)
    await anext(sub)
    await sub.aclose()
    assert producer.closed == 1 and producer.stream_closed == 1
    assert producer.advanced_payloads == [0]
    assert manager.stats() == []
    await sub.aclose()  # idempotent
    with pytest.raises(StopAsyncIteration):
        await anext(sub)


async def test_a_new_group_starts_after_the_last_subscriber_left(
    manager: SharedStreamManager,
) -> None:
    made: list[ScriptedProducer] = []

    def factory() -> ScriptedProducer:
        made.append(ScriptedProducer())
        made[-1].feed(len(made), 0)
        return made[-1]

    async with manager.subscribe("k", "s", producer=factory) as sub:
        assert await anext(sub) == 1
    async with manager.subscribe("k", "s", producer=factory) as sub:
        assert await anext(sub) == 2
    assert [p.closed for p in made] == [1, 1]


# -- cohort grace period ------------------------------------------------------------


async def test_cohort_grace_period_delays_the_first_poll(producer: ScriptedProducer) -> None:
    producer.feed("first", 0)
    async with SharedStreamManager(cohort_grace_period=0.3) as manager:
        a = manager.subscribe("k", "a", producer=lambda: producer)
        await asyncio.sleep(0.05)  # a restart's stragglers arrive a little later
        assert producer.opened == 0
        b = manager.subscribe("k", "b", producer=lambda: producer)
        assert await anext(a) == "first"
        assert await anext(b) == "first"
        await a.aclose()
        await b.aclose()
    assert outcomes(producer)[0] == AdvanceOutcome(2, 0, 0)


# -- upstream end and manager close -------------------------------------------------


async def test_upstream_end_frees_the_key_and_still_advances_resolved_events(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    for payload in [("A", 0), ("A", 1), ("B", 2)]:
        producer.feed(payload[1], payload)
    await anext(sub)
    await anext(sub)  # on event 1 when the upstream ends
    producer.end()
    await producer.wait_advanced(2)
    assert manager.stats() == []  # the key is free at once
    with pytest.raises(StreamTerminated):
        await anext(sub)  # event 2 was queued: not handed out
    got = outcomes(producer)
    assert got == {("A", 0): AdvanceOutcome(1, 0, 0), ("B", 2): AdvanceOutcome(0, 1, 0)}
    fresh = ScriptedProducer()
    fresh.feed("new", 0)
    async with manager.subscribe("k", "s2", producer=lambda: fresh) as again:
        assert await anext(again) == "new"
    await sub.aclose()
    assert producer.closed == 1


async def test_manager_aclose_terminates_iterating_subscribers(
    producer: ScriptedProducer,
) -> None:
    manager = SharedStreamManager()
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    producer.feed(0, 0)
    await anext(sub)
    waiting = asyncio.create_task(anext(sub))
    await turn()
    await manager.aclose()
    with pytest.raises(StreamTerminated):
        await waiting
    assert producer.closed == 1
    assert outcomes(producer) == {0: AdvanceOutcome(1, 0, 0)}  # the pull closed its window


# -- fast path ----------------------------------------------------------------------


async def test_fast_path_fans_out_without_bookkeeping(manager: SharedStreamManager) -> None:
    read = asyncio.Event()

    async def source() -> Any:
        for i in range(5):
            yield i
        await read.wait()

    a = manager.subscribe("fast", "a", source=source)
    b = manager.subscribe("fast", "b", source=source)
    assert [await anext(a) for _ in range(5)] == list(range(5))
    assert a.bind() is None
    assert [await anext(b) for _ in range(5)] == list(range(5))
    read.set()
    with pytest.raises(StreamTerminated):
        await anext(a)
    await a.aclose()
    await b.aclose()


async def test_fast_path_source_must_be_an_async_iterator(manager: SharedStreamManager) -> None:
    async with manager.subscribe("fast", "a", source=lambda: [1, 2]) as sub:  # type: ignore[arg-type, return-value]
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert isinstance(info.value.__cause__, TypeError)


async def test_unused_clock_fixture(clock: FakeClock) -> None:
    assert clock() == clock.now
