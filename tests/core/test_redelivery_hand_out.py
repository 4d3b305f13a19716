"""docs/concepts.md#redelivery-memory, last paragraph: the check is made again when a copy is handed
out.

A subscriber still working through its queue when a redelivered copy was broadcast
(it had not acked the earlier copy yet) is not handed the copy once it has acked
the earlier one: it counts ``acked`` for it, as if it had acked before the broadcast.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest

from ackgate import AckTimeout, AdvanceOutcome, SharedStreamManager, Subscription
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import outcomes, turn


class IdentifiedProducer(ScriptedProducer):
    """Payloads are ``(id, copy)``; the event id is the first half."""

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        return broker_payload[0]


#: "x" comes twice: its copy 2 is broadcast before anyone acked copy 1.
STREAM = [("x", 1), ("y", 1), ("w", 1), ("x", 2), ("z", 1)]


async def broadcast(
    manager: SharedStreamManager, stream: list[Any] = STREAM
) -> tuple[IdentifiedProducer, Subscription]:
    """The whole ``STREAM`` broadcast to "healthy" and "flaky" before anyone pulls;
    "flaky" rejects copy 1 of "x", so it is handed copy 2, and acks the rest
    and leaves (outcomes, when "healthy" acks everything: copy 1 ``(1, 0, 1)``, the
    rest ``(2, 0, 0)``). Returns "healthy"."""
    producer = IdentifiedProducer()
    healthy = manager.subscribe("k", "healthy", producer=lambda: producer)
    flaky = manager.subscribe("k", "flaky", producer=lambda: producer)
    for copy in stream:
        producer.feed(copy, copy)
    await turn()
    assert manager.stats()[0].outstanding == len(stream)
    assert await anext(flaky) == ("x", 1)
    flaky.reject("bad")
    assert await drain(flaky, "anext", manager, stream[-1]) == stream[1:]
    await flaky.aclose()  # acks "z"
    return producer, healthy


async def drain(sub: Subscription, how: str, manager: SharedStreamManager, last: Any) -> list[Any]:
    """What ``sub`` is handed, two events at a time by the bulk paths, each confirmed
    (acked) before the next hand-out, up to ``last``."""
    handed: list[Any] = []
    while last not in handed:
        if how == "anext":
            handed.append(await anext(sub))
        elif how == "async for":
            async for raw in sub:
                handed.append(raw)
                break
        elif how == "pull_bound":
            pairs = await sub.pull_bound(2)
            manager.confirm_persisted(seq for _, seq in pairs)
            handed.extend(raw for raw, _ in pairs)
        else:
            batch = await sub.pull_batch(2)
            manager.confirm_persisted([batch.seq])
            handed.extend(batch.events)
    return handed


@pytest.mark.parametrize("how", ["anext", "async for", "pull_bound", "pull_batch"])
async def test_a_copy_acked_since_its_broadcast_is_not_handed_out(
    manager: SharedStreamManager, how: str
) -> None:
    """Each hand-out path: copy 2 of "x" is skipped, the first of a pull (``pull_bound``
    and ``pull_batch`` take ``w`` with it: their bulk hand-out checks it)."""
    producer, healthy = await broadcast(manager)
    assert await drain(healthy, how, manager, ("z", 1)) == [
        ("x", 1),
        ("y", 1),
        ("w", 1),
        ("z", 1),
    ]
    (stats,) = manager.stats()
    assert stats.redeliveries_skipped == 1
    assert healthy.redeliveries_skipped == 1
    async with healthy:
        pass  # acks "z"; the group stops
    await producer.wait_advanced(len(STREAM))
    result = outcomes(producer)
    assert result.pop(("x", 1)) == AdvanceOutcome(1, 0, 1, ("flaky: bad",))
    assert set(result.values()) == {AdvanceOutcome(2, 0, 0)}


@pytest.mark.parametrize("earlier", ["rejected", "failed", "unconfirmed"])
async def test_a_subscriber_that_did_not_ack_the_earlier_copy_is_handed_the_copy(
    manager: SharedStreamManager, earlier: str
) -> None:
    producer, healthy = await broadcast(manager)
    assert await anext(healthy) == ("x", 1)
    seq = healthy.bind()
    assert seq is not None
    if earlier == "rejected":
        healthy.reject("bad")
    elif earlier == "failed":
        manager.fail_bound([seq])
    assert await drain(healthy, "anext", manager, ("z", 1)) == STREAM[1:]
    manager.confirm_persisted([seq])  # too late for copy 2: it was handed out already
    assert manager.stats()[0].redeliveries_skipped == 0
    async with healthy:
        pass
    await producer.wait_advanced(len(STREAM))
    assert outcomes(producer)[("x", 2)] == AdvanceOutcome(2, 0, 0)


async def test_a_copy_in_the_same_bulk_hand_out_as_the_earlier_one_is_handed_too(
    manager: SharedStreamManager,
) -> None:
    """Nothing of a batch is acked when it is handed out, so a copy in it is no skip."""
    _, healthy = await broadcast(manager)
    assert (await healthy.pull_batch(10)).events == STREAM
    assert healthy.redeliveries_skipped == 0


@pytest.mark.parametrize("crashed", [False, True])
async def test_leaving_resolves_a_queued_copy_acked_since_as_acked(
    manager: SharedStreamManager, crashed: bool
) -> None:
    producer, healthy = await broadcast(manager)
    assert await drain(healthy, "anext", manager, ("w", 1)) == STREAM[:3]  # acked "x"
    try:
        async with healthy:
            if crashed:
                raise RuntimeError("handler crashed on w")
    except RuntimeError:
        pass
    await producer.wait_advanced(len(STREAM))
    result = outcomes(producer)
    assert result[("w", 1)] == AdvanceOutcome(2 - crashed, int(crashed), 0)
    assert result[("x", 2)] == AdvanceOutcome(2, 0, 0)  # skipped, not failed
    assert result[("z", 1)] == AdvanceOutcome(1, 1, 0)  # never handed: failed
    assert healthy.redeliveries_skipped == 1


async def test_the_ack_timeout_does_not_fail_a_subscriber_for_a_copy_it_acked_since(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    """It sits on "w" (rejected) with copy 2 of "x" queued: copy 2 falls due, but it
    acked copy 1 meanwhile, so it owes nothing: counted acked, not force-failed."""
    producer, healthy = await broadcast(manager, STREAM[:4])
    assert await drain(healthy, "anext", manager, ("w", 1)) == STREAM[:3]
    healthy.reject()
    clock.advance(60.0)  # the manager's ack_timeout
    await turn()
    assert outcomes(producer)[("x", 2)] == AdvanceOutcome(2, 0, 0)
    assert manager.stats()[0].failed_subscribers == 0
    producer.feed(("z", 1), ("z", 1))
    assert await anext(healthy) == ("z", 1)  # not AckTimeout
    assert healthy.redeliveries_skipped == 1
    clock.advance(60.0)  # and "z", which it is on, still times out as ever
    await turn()
    with pytest.raises(AckTimeout):
        await anext(healthy)
