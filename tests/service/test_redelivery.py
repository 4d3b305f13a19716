"""A failure costs only its handler and what its ``ordering`` ties to the message
(docs/failure-semantics.md#redelivery-to-the-failing-handler): the failed message is handed to
the failing handler again, in-process, after a ``Redelivery`` backoff; the handlers that acked it
never see it again and the broker is not rewound; ``Message.attempt`` counts that handler's
hand-outs, so ``give_up_after`` is exact in calls. The backoffs run on the group's clock: a
``FakeClock`` moves them by hand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

import ackgate._service.retry as retry_module
from ackgate import Message, Redelivery, Retry, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import FakeClock


class Recorder:
    """The producers a service made, so a test reads what the broker was asked."""

    def __init__(self, broker: MemoryBroker, topic: str = "t") -> None:
        self.made: list[MemoryStreamProducer] = []
        self._broker = broker
        self._topic = topic

    def __call__(self) -> MemoryStreamProducer:
        producer = MemoryStreamProducer(self._broker, self._topic, "svc")
        self.made.append(producer)
        return producer


@pytest.fixture
def one_partition() -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("t", partitions=1)
    return broker


@pytest.fixture
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each backoff is its lower bound (half the ceiling): the test knows when it ends."""
    monkeypatch.setattr(retry_module.random, "uniform", lambda low, high: low)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run, one turn at a time, until ``condition()`` holds (the fake
    clock stands still meanwhile, so nothing but the turns can bring it about)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"backoff": -1.0}, "Redelivery.backoff must be"),
        ({"max_backoff": float("inf")}, "Redelivery.max_backoff must be"),
        ({"backoff": 2.0, "max_backoff": 1.0}, r"must be >= Redelivery.backoff"),
        ({"backoff": True}, "Redelivery.backoff must be"),
    ],
)
def test_bad_redelivery_values_are_refused(value: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Redelivery(**value)


def test_redelivery_must_be_a_redelivery_on_the_service_and_the_handler() -> None:
    with pytest.raises(TypeError, match="redelivery must be a Redelivery"):
        Service("k", producer=lambda: MemoryStreamProducer(MemoryBroker(), "t", "g"), redelivery=1)  # type: ignore[arg-type]
    service = Service("k", producer=lambda: MemoryStreamProducer(MemoryBroker(), "t", "g"))
    with pytest.raises(TypeError, match="handler 'h': redelivery must be a Redelivery or None"):

        @service.handler("h", redelivery=1.0)  # type: ignore[arg-type]
        async def h(message: Message) -> None:
            pass


def test_the_backoff_doubles_from_backoff_up_to_max_backoff(no_jitter: None) -> None:
    policy = Redelivery()
    assert [policy.delay(n) for n in (1, 2, 3, 7, 8, 50)] == [0.5, 1.0, 2.0, 30.0, 30.0, 30.0]


async def test_a_failed_message_goes_back_to_the_failing_handler_only(
    one_partition: MemoryBroker, running: Any, no_jitter: None
) -> None:
    for n in range(10):
        one_partition.publish("t", b"m%d" % n)
    clock = FakeClock()
    recorder = Recorder(one_partition)
    service = Service("svc", producer=recorder, clock=clock)
    seen: dict[str, list[bytes]] = {"store": [], "audit": []}
    attempts: list[int | None] = []

    @service.handler("store", concurrency=4, ordering="none")
    async def store(message: Message) -> None:
        seen["store"].append(message.body)

    @service.handler("audit", batch_size=4, batch_wait=0.01)
    async def audit(messages: list[Message]) -> None:
        seen["audit"].extend(m.body for m in messages)

    @service.handler("notify")
    async def notify(message: Message) -> None:
        if message.body == b"m3":
            attempts.append(message.attempt)
            if len(attempts) < 3:
                raise ConnectionError("mail server down")

    async with running(service):
        stats = service.stats
        await until(lambda: len(seen["store"]) == 10 and len(seen["audit"]) == 10, "healthy")
        await until(lambda: stats().handlers["notify"].awaiting_redelivery == 1, "parked")
        assert attempts == [1]
        clock.advance(0.5)  # the first backoff
        await until(lambda: len(attempts) == 2, "second hand-out")
        await until(lambda: stats().handlers["notify"].awaiting_redelivery == 1, "parked again")
        clock.advance(1.0)
        await one_partition.wait_drained("t", "svc")
    assert attempts == [1, 2, 3]
    assert sorted(seen["store"]) == sorted(seen["audit"]) == [b"m%d" % n for n in range(10)]
    (producer,) = recorder.made
    assert (producer.stats.held, producer.stats.redelivered) == (0, 0)  # never rewound
    notify_stats = service.stats().handlers["notify"]
    assert (notify_stats.handled, notify_stats.failed) == (10, 2)


@pytest.mark.parametrize(
    ("ordering", "handled_while_waiting"),
    [
        ("key", [b"b1", b"b2"]),  # only the key's later message waits
        ("lane", []),  # the whole lane (one partition) waits
        ("none", [b"a2", b"b1", b"b2"]),  # nothing waits
    ],
)
async def test_the_handlers_ordering_decides_what_waits_behind_a_failed_message(
    one_partition: MemoryBroker,
    running: Any,
    no_jitter: None,
    ordering: Any,
    handled_while_waiting: list[bytes],
) -> None:
    for body, key in ((b"a1", "a"), (b"b1", "b"), (b"a2", "a"), (b"b2", "b")):
        one_partition.publish("t", body, key=key)
    clock = FakeClock()
    service = Service("svc", producer=Recorder(one_partition), clock=clock)
    handled: list[bytes] = []
    failed = False

    @service.handler("h", ordering=ordering, concurrency=4)
    async def h(message: Message) -> None:
        nonlocal failed
        if message.body == b"a1" and not failed:
            failed = True
            raise ConnectionError("down")
        handled.append(message.body)

    async with running(service):
        await until(lambda: service.stats().handlers["h"].awaiting_redelivery == 1, "parked")
        await until(lambda: len(handled) >= len(handled_while_waiting), "the others")
        await asyncio.sleep(0)  # nothing more may run before the backoff ends
        assert sorted(handled) == handled_while_waiting
        clock.advance(0.5)
        await one_partition.wait_drained("t", "svc")
    assert sorted(handled) == [b"a1", b"a2", b"b1", b"b2"]
    if ordering != "none":
        assert handled.index(b"a1") < handled.index(b"a2")  # the key's order is kept


async def test_messages_behind_a_waiting_key_do_not_stop_the_handler_pulling_others(
    one_partition: MemoryBroker, running: Any
) -> None:
    """More messages wait behind the failed one than the handler's capacity (32): they
    do not count against it, so the other keys go on (the group's max_outstanding
    still bounds them)."""
    for n in range(100):
        one_partition.publish("t", b"a%d" % n, key="a")
    for n in range(20):
        one_partition.publish("t", b"b%d" % n, key="b")
    clock = FakeClock()
    service = Service("svc", producer=Recorder(one_partition), clock=clock)
    others = asyncio.Event()
    handled: list[bytes] = []

    @service.handler("h", ordering="key")
    async def h(message: Message) -> None:
        if message.body == b"a0" and not others.is_set():
            raise ConnectionError("down")
        handled.append(message.body)
        if len(handled) == 20:
            others.set()

    async with running(service):
        await others.wait()
        assert handled == [b"b%d" % n for n in range(20)]
        clock.advance(1.0)
        await one_partition.wait_drained("t", "svc")
    assert handled[20:] == [b"a%d" % n for n in range(100)]


async def test_a_message_failing_forever_costs_a_bounded_number_of_calls_and_lines(
    one_partition: MemoryBroker,
    running: Any,
    no_jitter: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    one_partition.publish("t", b"poison")
    one_partition.publish("t", b"fine")
    clock = FakeClock()
    service = Service("svc", producer=Recorder(one_partition), clock=clock)
    calls: list[int | None] = []

    @service.handler("h", ordering="none")
    async def h(message: Message) -> None:
        if message.body == b"poison":
            calls.append(message.attempt)
            raise ValueError("never")

    @service.handler("other")
    async def other(message: Message) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            for _ in range(60):  # one minute, a second at a time
                await until(
                    lambda: service.stats().handlers["h"].awaiting_redelivery == 1, "parked"
                )
                clock.advance(1.0)
                await asyncio.sleep(0)
            stats = service.stats().handlers["h"]
    # Backoffs of 0.5, 1, 2, 4, 8, 16 then 30 s: 7 calls in the first 60 s at most.
    assert 5 <= len(calls) <= 8
    assert calls == list(range(1, len(calls) + 1))  # attempt counts this handler's calls
    lines = [r for r in caplog.records if "failed on message" in r.getMessage()]
    assert len(lines) == len(calls)
    assert [r.exc_info is not None for r in lines].count(True) == 1  # one traceback
    assert stats.handled == 1 and stats.failed == len(calls)


async def test_past_half_the_ack_timeout_the_broker_redelivers_and_the_count_goes_on(
    one_partition: MemoryBroker,
    running: Any,
    no_jitter: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A backoff is never waited out in-process past half the ack timeout: the handler
    is never force-failed for waiting; the broker's redelivery takes over (a fresh ack
    timeout), and the handler's attempt count carries on across it."""
    one_partition.publish("t", b"poison")
    clock = FakeClock()
    recorder = Recorder(one_partition)
    service = Service(
        "svc",
        producer=recorder,
        clock=clock,
        ack_timeout=10.0,
        redelivery=Redelivery(backoff=8.0, max_backoff=8.0),
    )
    calls: list[int | None] = []

    @service.handler("h", give_up_after=3)
    async def h(message: Message) -> None:
        calls.append(message.attempt)
        raise ValueError("never")

    @service.handler("other")
    async def other(message: Message) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await until(lambda: service.stats().handlers["h"].awaiting_redelivery == 1, "parked")
            clock.advance(4.0)  # 4 s backoff, then 4 + 4 > 10 / 2: the broker redelivers
            await one_partition.wait_drained("t", "svc")
    assert calls == [1, 2, 3]
    assert not any("force-failed" in r.getMessage() for r in caplog.records)
    assert any("the broker redelivers it" in r.getMessage() for r in caplog.records)
    assert sum(p.stats.held for p in recorder.made) == 1
    (dead,) = one_partition.records("t.dlq")
    assert dead.value == b"poison"


async def test_a_failed_batch_is_handed_again_and_later_batches_wait_for_it(
    one_partition: MemoryBroker, running: Any, no_jitter: None
) -> None:
    for n in range(6):
        one_partition.publish("t", b"m%d" % n)
    clock = FakeClock()
    service = Service("svc", producer=Recorder(one_partition), clock=clock)
    batches: list[list[bytes]] = []

    @service.handler(
        "bulk", batch_size=3, batch_wait=60.0, retry=Retry(attempts=2, backoff=0, max_backoff=0)
    )
    async def bulk(messages: list[Message]) -> None:
        batches.append([m.body for m in messages])
        if len(batches) <= 2:
            raise OSError("disk full")

    async with running(service):
        await until(lambda: service.stats().handlers["bulk"].awaiting_redelivery == 3, "parked")
        assert batches == [[b"m0", b"m1", b"m2"]] * 2  # the retry, then parked
        clock.advance(0.5)
        await one_partition.wait_drained("t", "svc")
    assert batches[2:] == [[b"m0", b"m1", b"m2"], [b"m3", b"m4", b"m5"]]
