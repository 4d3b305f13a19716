"""Per-handler redelivery under random failure schedules
(docs/failure-semantics.md#redelivery-to-the-failing-handler): whatever each handler fails, and
however often, each handler is called on each message exactly as often as its own failures and
``give_up_after`` say (attempts 1, 2, ... as it sees them), never again once it acked it; per-key
order holds for ordered handlers; each given-up message is dead-lettered exactly once; everything
is committed. A few examples by default; ``ACKGATE_REDELIVERY_EXAMPLES=10000`` for the long run."""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackgate import Message, Redelivery, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

EXAMPLES = int(os.environ.get("ACKGATE_REDELIVERY_EXAMPLES", "25"))

handler_specs = st.fixed_dictionaries(
    {
        "ordering": st.sampled_from(["key", "lane", "none"]),
        "concurrency": st.integers(1, 3),
        "give_up_after": st.none() | st.integers(1, 3),
    }
)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    messages = draw(st.integers(1, 10))
    keys = [draw(st.sampled_from(["a", "b", "c"])) for _ in range(messages)]
    handlers = draw(st.lists(handler_specs, min_size=1, max_size=3))
    # How many times each handler fails each message before it succeeds.
    fails = [[draw(st.integers(0, 3)) for _ in range(messages)] for _ in handlers]
    partitions = draw(st.integers(1, 2))
    return {"keys": keys, "handlers": handlers, "fails": fails, "partitions": partitions}


async def play(scenario: dict[str, Any]) -> None:
    keys: list[str] = scenario["keys"]
    broker = MemoryBroker()
    broker.create_topic("t", partitions=scenario["partitions"])
    for n, key in enumerate(keys):
        broker.publish("t", b"%d" % n, key=key)
    service = Service(
        "svc",
        producer=lambda: MemoryStreamProducer(broker, "t", "g"),
        redelivery=Redelivery(backoff=0.0, max_backoff=0.0),
    )
    calls: dict[int, dict[int, list[int | None]]] = defaultdict(lambda: defaultdict(list))
    order: dict[int, list[int]] = defaultdict(list)

    def register(index: int, spec: dict[str, Any]) -> None:
        @service.handler(f"h{index}", **spec)
        async def handle(message: Message) -> None:
            n = int(message.body)
            seen = calls[index][n]
            seen.append(message.attempt)
            order[index].append(n)
            await asyncio.sleep(0)  # let the others interleave
            if len(seen) <= scenario["fails"][index][n]:
                raise ConnectionError("scheduled failure")

    for index, spec in enumerate(scenario["handlers"]):
        register(index, spec)
    async with asyncio.timeout(30):
        running = asyncio.create_task(service.run())
        await broker.wait_drained("t", "g")
        await service.stop()
        await running
    given_up: set[int] = set()
    for index, spec in enumerate(scenario["handlers"]):
        limit = spec["give_up_after"]
        for n in range(len(keys)):
            failures = scenario["fails"][index][n]
            expected = failures + 1 if limit is None else min(failures + 1, limit)
            if limit is not None and failures >= limit:
                given_up.add(n)
            assert calls[index][n] == list(range(1, expected + 1)), (index, n)
        if spec["ordering"] != "none":
            for key in set(keys):
                mine = [n for n in order[index] if keys[n] == key]
                distinct = [n for i, n in enumerate(mine) if i == 0 or mine[i - 1] != n]
                assert distinct == sorted(distinct), (index, key, mine)
    dead = sorted(int(record.value) for record in broker.records("t.dlq"))
    assert dead == sorted(given_up)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenarios())
def test_each_handler_pays_only_for_its_own_failures(scenario: dict[str, Any]) -> None:
    asyncio.run(play(scenario))
