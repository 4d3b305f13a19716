"""The bulk advance contract: AdvanceRun, IdRange and the default advance_runs."""

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from ackgate import AdvanceItem, AdvanceOutcome, AdvanceRun, IdRange, SharedStreamProducer

CLEAN = AdvanceOutcome(2, 0, 0)
FAILED = AdvanceOutcome(1, 1, 0)


class Recording(SharedStreamProducer):
    def __init__(self) -> None:
        self.batches: list[list[AdvanceItem]] = []

    async def open_stream(self) -> Any:
        raise NotImplementedError
        yield

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.batches.append(list(batch))


def test_a_run_lists_only_the_outcomes_that_differ() -> None:
    run = AdvanceRun(["a", "b", "c"], CLEAN, {1: FAILED})
    assert [run.outcome_of(i) for i in range(3)] == [CLEAN, FAILED, CLEAN]
    assert run.items() == [
        AdvanceItem("a", CLEAN),
        AdvanceItem("b", FAILED),
        AdvanceItem("c", CLEAN),
    ]
    assert AdvanceRun(["a"], CLEAN).exceptions == {}


async def test_the_default_advance_runs_is_advance_of_every_event_in_order() -> None:
    producer = Recording()
    await producer.advance_runs(
        [AdvanceRun(["a", "b"], CLEAN), AdvanceRun(["c", "d"], CLEAN, {0: FAILED})]
    )
    assert producer.batches == [
        [
            AdvanceItem("a", CLEAN),
            AdvanceItem("b", CLEAN),
            AdvanceItem("c", FAILED),
            AdvanceItem("d", CLEAN),
        ]
    ]


def test_an_id_range_is_the_sequence_of_its_ids() -> None:
    ids = IdRange(("orders", 3), 100, 4)
    assert len(ids) == 4
    assert list(ids) == [
        ("orders", 3, 100),
        ("orders", 3, 101),
        ("orders", 3, 102),
        ("orders", 3, 103),
    ]
    assert ids[0] == ("orders", 3, 100)
    assert ids[-1] == ("orders", 3, 103)
    assert ids[1:3] == IdRange(("orders", 3), 101, 2)
    assert ids == list(ids)
    assert ids != IdRange(("orders", 3), 101, 4)
    with pytest.raises(IndexError):
        ids[4]
    with pytest.raises(ValueError, match="step 1"):
        ids[::2]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((["orders", 3], 0, 1), TypeError),
        ((("orders",), 0, -1), ValueError),
        ((("o",), 1.0, 1), ValueError),
    ],
)
def test_an_id_range_refuses_what_is_not_one(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        IdRange(*args)


class RunRecording(Recording):
    def __init__(self) -> None:
        super().__init__()
        self.runs: list[list[AdvanceRun]] = []

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        self.runs.append(list(runs))


async def test_a_group_advances_a_producer_that_takes_runs_by_runs() -> None:
    from ackgate import SharedStreamManager

    class Feeding(RunRecording):
        async def open_stream(self) -> Any:
            for n in range(4):
                yield f"e{n}", n
            await asyncio.Event().wait()  # the upstream stays open

    fed = Feeding()
    async with (
        SharedStreamManager() as manager,
        manager.subscribe("k", "a", producer=lambda: fed) as sub,
    ):
        async for raw in sub:
            if raw == "e1":
                sub.reject("no")
            if raw == "e3":
                break
    flat = [
        (payload, run.outcome_of(index))
        for runs in fed.runs
        for run in runs
        for index, payload in enumerate(run.broker_payloads)
    ]
    one = AdvanceOutcome(1, 0, 0)
    assert [payload for payload, _ in flat] == [0, 1, 2, 3]
    assert flat[0][1] == one
    assert flat[1][1].rejected == 1 and flat[1][1].reasons == ("a: no",)
    assert all(outcome == one for _, outcome in flat[2:])
    assert fed.batches == []  # advance() itself is never called
