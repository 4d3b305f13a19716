"""docs/concepts.md#deferred-resolution: bound outputs resolved later — confirm, reject or fail —
and reasons."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ackgate import (
    AdvanceOutcome,
    SharedStreamManager,
    reject_shared_stream_event,
)
from ackgate.testing import ScriptedProducer

from .conftest import outcomes, turn


@pytest.mark.parametrize("how", ["reject", "fail"])
async def test_resolving_a_bound_output_resolves_its_event_with_the_window_open(
    manager: SharedStreamManager, how: str
) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await anext(sub)
        first, second = sub.bind(), sub.bind()
        assert first is not None and second is not None
        if how == "reject":
            manager.reject_bound([first], reason="unparseable")
        else:
            manager.fail_bound(iter([first]))
        await producer.wait_advanced(1)  # at once: the window is still open
        assert sub.bind() is None  # resolved for this subscriber: nothing binds
        manager.confirm_persisted([second])  # stale now
        manager.reject_bound([second])
    expected = (
        AdvanceOutcome(0, 0, 1, ("s: unparseable",)) if how == "reject" else AdvanceOutcome(0, 1, 0)
    )
    assert outcomes(producer) == {0: expected}


async def test_the_first_resolution_of_an_event_wins(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    producer.feed("b", 1)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await anext(sub)
        one, two, three = sub.bind(), sub.bind(), sub.bind()
        await anext(sub)  # window on "a" closed; its outputs still outstanding
        manager.confirm_persisted([one])  # counts towards acked, not decisive
        manager.fail_bound([two])  # decides: failed
        manager.reject_bound([three], reason="too late")  # the same event: nothing
        manager.reject_bound([one, two, 10**9, None, "x"], reason="stale")  # nothing
        await producer.wait_advanced(1)
    assert outcomes(producer)[0] == AdvanceOutcome(0, 1, 0)


async def test_resolving_after_the_subscriber_left(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    keeper = manager.subscribe("k", "keeper", producer=lambda: producer)  # keeps the group
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await anext(sub)
        seq = sub.bind()
        assert seq is not None
    await anext(keeper)
    assert sub._group.departed == {sub}
    manager.reject_bound([seq], reason="late verdict")
    await keeper.aclose()
    assert outcomes(producer)[0] == AdvanceOutcome(1, 0, 1, ("s: late verdict",))
    assert not sub._group.departed


async def test_reasons_are_in_subscription_order(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    producer.feed("b", 1)
    # Subscription order: "zeta" subscribed first, then "alpha", then "mid" (not by id).
    zeta = manager.subscribe("k", "zeta", producer=lambda: producer)
    alpha = manager.subscribe("k", "alpha", producer=lambda: producer)
    mid = manager.subscribe("k", "mid", producer=lambda: producer)
    quiet = manager.subscribe("k", 7, producer=lambda: producer)
    for sub in (zeta, alpha, mid, quiet):
        await anext(sub)
    seq = zeta.bind()
    assert seq is not None
    mid.reject("mid's reason")  # rejected first in time...
    alpha.reject()  # no reason: counted, not listed
    quiet.reject("id 7")
    manager.reject_bound([seq], reason="zeta's reason")  # ...but zeta subscribed first
    for sub in (zeta, alpha, mid, quiet):
        await sub.aclose()
    assert outcomes(producer)[0] == AdvanceOutcome(
        0, 0, 4, ("zeta: zeta's reason", "mid: mid's reason", "7: id 7")
    )
    assert outcomes(producer)[1] == AdvanceOutcome(0, 4, 0)  # never handed: failed


async def test_a_resubscribed_id_counts_from_its_new_subscribe(
    manager: SharedStreamManager,
) -> None:
    producer = ScriptedProducer()
    first = manager.subscribe("k", "a", producer=lambda: producer)
    manager.subscribe("k", "b", producer=lambda: producer)
    await first.aclose()
    again = manager.subscribe("k", "a", producer=lambda: producer)  # now after "b"
    b = manager.subscribe("k", "b2", producer=lambda: producer)
    producer.feed("x", 0)
    (b_sub,) = [s for s in again._group.members.values() if s.subscriber_id == "b"]
    for sub in (again, b_sub, b):
        await anext(sub)
        sub.reject("no")
    for sub in (again, b_sub, b):
        await sub.aclose()
    assert outcomes(producer)[0].reasons == ("b: no", "a: no", "b2: no")


async def test_reject_module_function_takes_a_reason(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await anext(sub)
        reject_shared_stream_event("poison")
        await producer.wait_advanced(1)
    assert outcomes(producer)[0] == AdvanceOutcome(0, 0, 1, ("s: poison",))


async def test_a_reason_must_be_a_str(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await anext(sub)
        seq = sub.bind()
        bad: Any = b"bytes"
        with pytest.raises(TypeError, match="reason"):
            sub.reject(bad)
        with pytest.raises(TypeError, match="reason"):
            reject_shared_stream_event(bad)
        with pytest.raises(TypeError, match="reason"):
            manager.reject_bound([seq], reason=bad)
        with pytest.raises(TypeError):
            manager.fail_bound(3)  # type: ignore[arg-type]
        assert sub.bind() is not None  # nothing was resolved by the refused calls


async def test_no_reason_shares_the_cached_outcome(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    for i in range(3):
        producer.feed(i, i)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for _ in range(3):
            await anext(sub)
            sub.reject()
        await producer.wait_advanced(3)
    first, second, third = outcomes(producer).values()
    assert first is second is third  # no allocation per event without reasons


@pytest.mark.parametrize("how", ["confirm", "reject", "fail"])
async def test_resolving_from_another_thread(manager: SharedStreamManager, how: str) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await anext(sub)
        seq = sub.bind()
        call = {
            "confirm": lambda: manager.confirm_persisted([seq]),  # type: ignore[list-item]
            "reject": lambda: manager.reject_bound([seq], reason="from a thread"),  # type: ignore[list-item]
            "fail": lambda: manager.fail_bound([seq]),  # type: ignore[list-item]
        }[how]
        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
        producer.feed("b", 1)
        await anext(sub)
        await producer.wait_advanced(1)
    assert (
        outcomes(producer)[0]
        == {
            "confirm": AdvanceOutcome(1, 0, 0),
            "reject": AdvanceOutcome(0, 0, 1, ("s: from a thread",)),
            "fail": AdvanceOutcome(0, 1, 0),
        }[how]
    )


def test_stale_calls_from_a_thread_after_the_loop_closed_are_ignored() -> None:
    async def bind_and_close() -> tuple[SharedStreamManager, int]:
        producer = ScriptedProducer()
        producer.feed("a", 0)
        manager = SharedStreamManager()
        sub = manager.subscribe("k", "s", producer=lambda: producer)
        await anext(sub)
        seq = sub.bind()
        assert seq is not None
        await manager.aclose()
        await turn()
        return manager, seq

    manager, seq = asyncio.run(bind_and_close())  # the loop is closed now
    errors: list[BaseException] = []

    def late() -> None:
        try:
            manager.confirm_persisted([seq])
            manager.reject_bound([seq], reason="late")
            manager.fail_bound([seq])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    thread.join()
    assert errors == []
