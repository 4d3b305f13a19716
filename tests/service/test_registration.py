"""docs/production.md#service-options: Service(...) and @service.handler(...) arguments, and the
run() lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from ackgate import Message, Retry, Service, SharedStreamManager
from ackgate.adapters.memory import MemoryStreamProducer
from ackgate.testing import ScriptedProducer


async def noop(message: Message) -> None:
    pass


def make() -> ScriptedProducer:
    return ScriptedProducer()


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="key must not be None"):
        Service(None, producer=make)
    with pytest.raises(ValueError, match="hashable"):
        Service(["k"], producer=make)
    with pytest.raises(TypeError, match="zero-argument factory"):
        Service("k", producer=ScriptedProducer())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ack_timeout"):
        Service("k", producer=make, ack_timeout=0)  # a SharedStreamManager argument
    with pytest.raises(ValueError, match=r"manager options \['ack_timeout'\]"):
        Service("k", producer=make, manager=SharedStreamManager(), ack_timeout=5.0)
    with pytest.raises(ValueError, match="restart_backoff must be"):
        Service("k", producer=make, restart_backoff=-1)
    with pytest.raises(ValueError, match="max_restart_backoff"):
        Service("k", producer=make, restart_backoff=2.0, max_restart_backoff=1.0)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"concurrency": 0}, ValueError, "concurrency must be an int >= 1"),
        ({"concurrency": 2.5}, ValueError, "concurrency must be an int"),
        ({"ordering": "partition"}, ValueError, 'ordering must be "lane", "key" or "none"'),
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1"),
        ({"batch_size": 10, "batch_wait": -1}, ValueError, "batch_wait must be a finite"),
        ({"batch_size": 10, "batch_wait": float("inf")}, ValueError, "batch_wait must be"),
        ({"batch_wait": 0.5}, ValueError, "batch_wait applies to batch handlers only"),
        ({"batch_size": 10, "concurrency": 2}, ValueError, 'pass ordering="none"'),
        ({"retry": 3}, TypeError, "retry must be a Retry"),
    ],
)
def test_handler_options_are_checked(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    service = Service("k", producer=make)
    with pytest.raises(error, match=match):
        service.handler("h", **options)(noop)
    assert service.stats().handlers == {}


def test_handler_must_be_async_def() -> None:
    service = Service("k", producer=make)

    def sync(message: Message) -> None:
        pass

    async def generator(message: Message) -> Any:
        yield message

    for function in (sync, generator, lambda message: noop(message)):
        with pytest.raises(TypeError, match="must be an async def function"):
            service.handler("h")(function)

    class Handler:
        async def __call__(self, message: Message) -> None:
            pass

    service.handler("callable object")(Handler())

    async def batch(messages: list[Message]) -> None:
        pass

    service.handler("batch", batch_size=10, concurrency=3, ordering="none")(batch)


def test_handler_ids_are_unique_non_empty_strs() -> None:
    service = Service("k", producer=make)
    assert service.handler("h")(noop) is noop  # returned unchanged
    with pytest.raises(ValueError, match="'h' is already registered"):
        service.handler("h", concurrency=4)(noop)
    with pytest.raises(ValueError, match="non-empty str"):
        service.handler("")(noop)
    with pytest.raises(ValueError, match="non-empty str"):
        service.handler(7)(noop)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("retry", "match"),
    [
        ({"attempts": 0}, r"attempts \(it counts the first call\) must be an int >= 1"),
        ({"attempts": 1.5}, r"attempts \(it counts the first call\) must be an int >= 1"),
        ({"backoff": -0.1}, "backoff must be a finite number"),
        ({"max_backoff": float("nan")}, "max_backoff must be a finite number"),
        ({"backoff": 2.0, "max_backoff": 1.0}, r"max_backoff \(1.0\) must be >= Retry.backoff"),
    ],
)
def test_retry_is_checked(retry: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Retry(**retry)


def test_retry_delays_grow_with_jitter_and_are_capped() -> None:
    retry = Retry(attempts=10, backoff=0.1, max_backoff=1.0)
    for n, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = {retry.delay(n) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jittered
    assert Retry(attempts=3, backoff=0.0, max_backoff=0.0).delay(2) == 0.0


async def test_run_needs_a_handler() -> None:
    with pytest.raises(ValueError, match="no handler"):
        await Service("k", producer=make).run()


async def test_registering_after_run_started_and_running_twice(
    memory_producer: Callable[[], MemoryStreamProducer], running: Any
) -> None:
    service = Service("orders", producer=memory_producer)
    service.handler("h")(noop)
    async with running(service):
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="before run"):
            service.handler("late")(noop)
        with pytest.raises(RuntimeError, match="run\\(\\) may be called once"):
            await service.run()
    with pytest.raises(RuntimeError, match="before run"):
        service.handler("later")(noop)


async def test_stop_before_run_makes_run_return_at_once() -> None:
    service = Service("k", producer=make)
    service.handler("h")(noop)
    await service.stop()
    async with asyncio.timeout(5):
        await service.run()
    assert service.stats().state == "stopped"
    with pytest.raises(ValueError, match="timeout must be"):
        await service.stop(-1)


async def test_a_given_manager_is_used_and_left_open() -> None:
    scripted = ScriptedProducer()
    scripted.feed(b"one", 0)
    async with SharedStreamManager() as manager:
        service = Service("k", producer=lambda: scripted, manager=manager)
        done = asyncio.Event()

        @service.handler("h")
        async def handle(message: Message) -> None:
            done.set()

        task = asyncio.create_task(service.run())
        await done.wait()
        assert [g.key for g in manager.stats()] == ["k"]
        await service.stop()
        await task
        assert manager.stats() == []
        manager.subscribe("other", "x", producer=ScriptedProducer)  # still open
