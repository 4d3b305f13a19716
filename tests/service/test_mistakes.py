"""docs/production.md#handler-mistakes: handler mistakes are never silent. A handler used without
parentheses, with a signature that cannot take a message, returning a value, raising CancelledError,
KeyboardInterrupt or SystemExit: each is refused or handled without losing a message, and the error
names the handler and the mistake."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ackgate._service.feed
from ackgate import AdvanceOutcome, Message, Redelivery, Reject, Retry, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import FakeClock, ScriptedProducer

#: A redelivery backoff past half the ack timeout: a failed message is failed to the
#: broker, which redelivers it (docs/failure-semantics.md#redelivery-to-the-failing-handler).
BROKER_REDELIVERS = Redelivery(backoff=1e3, max_backoff=1e3)


def make() -> ScriptedProducer:
    return ScriptedProducer()


def outcomes(producer: ScriptedProducer) -> dict[Any, AdvanceOutcome]:
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


# -- at decoration ---------------------------------------------------------------------


def test_handler_without_parentheses_is_refused_naming_the_fix() -> None:
    service = Service("k", producer=make)

    with pytest.raises(TypeError, match=r"write @service.handler\('index'\) above"):

        @service.handler  # type: ignore[arg-type]
        async def index(message: Message) -> None:
            pass

    assert service.stats().handlers == {}


async def _none() -> None:
    pass


async def _two(message: Message, context: object) -> None:
    pass


async def _keyword_only(*, message: Message) -> None:
    pass


async def _three(a: int, b: int, message: Message) -> None:
    pass


class _NoArgument:
    async def __call__(self) -> None:
        pass


@pytest.mark.parametrize(
    ("function", "shown"),
    [
        (_none, r"_none\(\)"),
        (_two, r"_two\(message, context\)"),
        (_keyword_only, r"_keyword_only\(\*, message\)"),
        (_NoArgument(), r"_NoArgument\(\)"),
        (functools.partial(_two, None, None), r"functools.partial\(_two\)\(\)"),
    ],
)
def test_a_signature_that_cannot_take_one_message_is_refused(function: Any, shown: str) -> None:
    service = Service("k", producer=make)
    with pytest.raises(TypeError, match=rf"handler 'h': {shown} cannot be called with one Message"):
        service.handler("h")(function)
    with pytest.raises(TypeError, match="with a list of Message"):
        service.handler("batch", batch_size=10)(function)
    assert service.stats().handlers == {}


def test_signatures_that_take_one_message_are_accepted() -> None:
    service = Service("k", producer=make)

    async def star_args(*messages: Message) -> None:
        pass

    async def with_default(message: Message, context: object = None) -> None:
        pass

    class Handlers:
        async def method(self, message: Message) -> None:
            pass

        async def __call__(self, message: Message) -> None:
            pass

    for n, function in enumerate(
        [star_args, with_default, Handlers().method, Handlers(), functools.partial(_three, 1, 2)]
    ):
        service.handler(f"h{n}")(function)

    async def batch_with_default(messages: list[Message], context: object = None) -> None:
        pass

    service.handler("batch", batch_size=10)(batch_with_default)
    assert len(service.stats().handlers) == 6


async def _listed(messages: list[Message]) -> None:
    pass


async def _listed_as_text(messages: "list[Message[int]]") -> None:  # noqa: UP037 - as text
    pass


async def _one(message: Message) -> None:
    pass


async def _one_typed(message: Message[dict[str, int]]) -> None:
    pass


@pytest.mark.parametrize("function", [_listed, _listed_as_text])
def test_a_list_parameter_without_batch_size_is_refused_naming_batch_size(function: Any) -> None:
    service = Service("k", producer=make)
    with pytest.raises(TypeError, match=r"handler 'h': .*annotated as a list.*pass batch_size=N"):
        service.handler("h")(function)
    service.handler("h", batch_size=10)(function)  # the same function, as a batch handler
    assert list(service.stats().handlers) == ["h"]


@pytest.mark.parametrize("function", [_one, _one_typed])
def test_batch_size_on_a_parameter_annotated_as_one_message_is_refused(function: Any) -> None:
    service = Service("k", producer=make)
    with pytest.raises(TypeError, match=r"handler 'h': batch_size=10 makes it a batch handler"):
        service.handler("h", batch_size=10)(function)
    service.handler("h")(function)
    assert list(service.stats().handlers) == ["h"]


@pytest.mark.parametrize(
    ("key", "match"),
    [
        ("", "must not be empty or blank"),
        ("  ", "must not be empty or blank"),
        (b"", "must not be empty or blank"),
        ("orders\n", "must be printable"),
    ],
)
def test_a_key_that_names_nothing_is_refused(key: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Service(key, producer=make)


# -- while running ---------------------------------------------------------------------


async def test_a_returned_reject_rejects_with_its_reason(running: Any) -> None:
    scripted = ScriptedProducer()
    scripted.feed(b"torn", "p0")
    service = Service("k", producer=lambda: scripted)
    calls = 0

    @service.handler("auditor", retry=Retry(attempts=3, backoff=0.0, max_backoff=0.0))
    async def audit(message: Message) -> Reject:
        nonlocal calls
        calls += 1
        return Reject("not JSON")

    async with running(service):
        await scripted.wait_advanced(1)
    assert outcomes(scripted)["p0"] == AdvanceOutcome(0, 0, 1, ("auditor: not JSON",))
    assert calls == 1  # never retried
    assert service.stats().handlers["auditor"].rejected == 1


async def test_returning_a_value_fails_the_call_naming_the_handler(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted, redelivery=BROKER_REDELIVERS)

    @service.handler("indexer", retry=Retry(attempts=2, backoff=0.0, max_backoff=0.0))
    async def index(message: Message) -> bool:
        return True  # meant as "ok"

    async with running(service):
        await scripted.wait_advanced(3)
    assert all(o == AdvanceOutcome(0, 1, 0) for o in outcomes(scripted).values())
    stats = service.stats().handlers["indexer"]
    assert (stats.handled, stats.retried, stats.failed) == (0, 3, 3)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # once per handler, not once per call
    assert "handler 'indexer' returned bool; it must return None (ack) or a Reject" in (
        errors[0].getMessage()
    )
    failures = [r.getMessage() for r in caplog.records if "after 2 call(s)" in r.getMessage()]
    assert len(failures) == 3 and all("TypeError" in line for line in failures)


async def test_a_batch_handler_returning_a_list_fails_the_batch(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted, redelivery=BROKER_REDELIVERS)

    @service.handler("bulk", batch_size=3, batch_wait=5.0)
    async def bulk(messages: list[Message]) -> list[Message]:
        return messages

    async with running(service):
        await scripted.wait_advanced(3)
    assert all(o == AdvanceOutcome(0, 1, 0) for o in outcomes(scripted).values())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "handler 'bulk' returned list; it must return None" in errors[0]


async def test_cancelled_error_raised_by_the_handler_is_a_failure_and_the_lane_goes_on(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedProducer()  # one lane: each waits for the one before
    for n in range(40):  # more than the handler holds at once
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted, redelivery=BROKER_REDELIVERS)
    calls: list[bytes] = []

    @service.handler("h", retry=Retry(attempts=2, backoff=0.0, max_backoff=0.0))
    async def handle(message: Message) -> None:
        calls.append(message.body)
        if message.body == b"0":
            raise asyncio.CancelledError  # e.g. a client library's cancelled future
        if message.body == b"1" and calls.count(b"1") == 1:
            raise asyncio.CancelledError  # its retry succeeds

    async with running(service):
        await scripted.wait_advanced(40)
    assert outcomes(scripted)[0] == AdvanceOutcome(0, 1, 0)
    assert all(outcomes(scripted)[n].is_clean for n in range(1, 40))
    stats = service.stats().handlers["h"]
    assert (stats.handled, stats.failed, stats.retried) == (39, 1, 2)
    assert "handler 'h' failed on message id=" in caplog.text and "CancelledError" in caplog.text


async def test_a_call_cancelled_by_the_ack_timeout_is_not_retried(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    """The other side of the previous test: a real cancellation of the call is not a
    failure of the handler; the broker redelivers the message."""
    publish(1)
    clock = FakeClock()
    service = Service("orders", producer=memory_producer, ack_timeout=10.0, clock=clock)
    calls = 0
    hung = asyncio.Event()
    cancelled = asyncio.Event()

    @service.handler("stuck", retry=Retry(attempts=3, backoff=0.0, max_backoff=0.0))
    async def stuck(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            hung.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async with running(service):
        await hung.wait()
        clock.advance(11.0)  # the ack timeout fires: the call is cancelled
        await cancelled.wait()
        await broker.wait_drained("orders", "svc")
    stats = service.stats().handlers["stuck"]
    assert calls == 2  # the cancelled call, then the redelivered copy; no retry between
    assert (stats.retried, stats.failed, stats.handled) == (0, 0, 1)


@pytest.mark.parametrize(
    "exit_", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"]
)
async def test_system_exit_in_a_handler_stops_gracefully_then_leaves_run(
    exit_: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedProducer(lane=lambda payload: payload)
    scripted.feed(b"slow", 0)
    scripted.feed(b"exit", 1)
    scripted.feed(b"later", 2)
    service = Service("k", producer=lambda: scripted)
    slow_started = asyncio.Event()
    exited = asyncio.Event()
    handed: list[bytes] = []

    @service.handler("slow", concurrency=3)
    async def slow(message: Message) -> None:
        handed.append(message.body)
        if message.body == b"slow":
            slow_started.set()
            await exited.wait()  # a call in progress when the service stops: it finishes

    @service.handler("exits")
    async def exits(message: Message) -> None:
        await slow_started.wait()
        if message.body == b"exit":
            exited.set()
            raise exit_

    async with asyncio.timeout(10):
        with pytest.raises(type(exit_)) as raised:
            await service.run()
    assert raised.value is exit_
    assert outcomes(scripted)[0].is_clean  # both finished it: advanced
    assert outcomes(scripted)[1] == AdvanceOutcome(1, 1, 0)  # failed by "exits": redelivered
    assert 2 not in outcomes(scripted) or outcomes(scripted)[2].failed
    assert scripted.closed == 1 and service.stats().state == "stopped"
    assert f"handler 'exits' raised {exit_!r} on message id=1; the service stops" in caplog.text


class _StuckAdvance(ScriptedProducer):
    """Its advances never return (a broker that stopped answering)."""

    def __init__(self) -> None:
        super().__init__()
        self.advancing = asyncio.Event()

    async def advance(self, batch: Any) -> None:
        self.advancing.set()
        await asyncio.Event().wait()


async def test_the_groups_stop_is_bounded_when_an_advance_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stuck = _StuckAdvance()
    stuck.feed(b"one", 0)
    service = Service("k", producer=lambda: stuck)

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await stuck.advancing.wait()
        await service.stop(timeout=0)  # the final stop still gets a second
        await run
    assert stuck.closed == 1
    assert "service 'k': the group's stop (its final advances, closing the producer) took" in (
        caplog.text
    )


async def test_a_hard_stop_bounds_the_groups_stop_by_the_default_stop_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run()`` cancelled with no ``stop()`` first (asyncio.run() tearing down): the
    group's stop gets ``stop()``'s default timeout (30 s, shortened here)."""
    monkeypatch.setattr(ackgate._service.feed, "DEFAULT_STOP_TIMEOUT", 0.0)
    stuck = _StuckAdvance()
    stuck.feed(b"one", 0)
    service = Service("k", producer=lambda: stuck)

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await stuck.advancing.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert stuck.closed == 1 and service.stats().state == "stopped"


# -- as a process ----------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]

MAIN_RAISES = """
import asyncio
import atexit
import json

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders", partitions=4)
for n in range(2000):
    broker.publish("orders", b"m%d" % n)
service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "app"))
handled = {"slow": set(), "bulk": set()}
busy = asyncio.Event()


@service.handler("slow", concurrency=4)
async def slow(message: Message) -> None:
    await asyncio.sleep(0.001)
    handled["slow"].add(message.id)
    if len(handled["slow"]) > 100:
        busy.set()


@service.handler("bulk", batch_size=50, batch_wait=0.01)
async def bulk(messages: list[Message]) -> None:
    handled["bulk"].update(message.id for message in messages)


@atexit.register
def report() -> None:
    both = handled["slow"] & handled["bulk"]
    print("committed", json.dumps(broker.committed("orders", "app")), flush=True)
    print("handled", json.dumps(sorted(both)), flush=True)


async def main() -> None:
    asyncio.create_task(service.run())
    await busy.wait()
    raise RuntimeError("the user's own bug")


asyncio.run(main())
"""

STUCK = """
import asyncio

import ackgate._service.feed
from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

ackgate._service.feed.DEFAULT_STOP_TIMEOUT = 0.5  # a hard stop's bound (30 s), shortened


class Stuck(MemoryStreamProducer):
    async def advance(self, batch):
        await asyncio.Event().wait()  # a broker that stopped answering


broker = MemoryBroker()
broker.create_topic("orders", partitions=4)
for n in range(200):
    broker.publish("orders", b"m%d" % n)
service = Service("orders", producer=lambda: Stuck(broker, "orders", "app"))
busy = asyncio.Event()


@service.handler("fast", concurrency=4)
async def fast(message: Message) -> None:
    busy.set()


@service.handler("slow")
async def slow(message: Message) -> None:
    await asyncio.sleep(0.01)


async def main() -> None:
    asyncio.create_task(service.run())
    await busy.wait()
    await asyncio.sleep(0.05)
    raise RuntimeError("the user's own bug")


asyncio.run(main())
"""

EXITS = """
import sys

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders")
for n in range(10):
    broker.publish("orders", b"m%d" % n)
service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "app"))


@service.handler("migrator")
async def migrate(message: Message) -> None:
    if message.body == b"m5":
        sys.exit(3)
"""


def _python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,  # a regression fails instead of hanging
    )


def test_an_exception_in_main_tears_down_within_bounds_and_is_the_one_shown(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.py").write_text(MAIN_RAISES)
    done = _python(tmp_path, "app.py")
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert done.stderr.rstrip().endswith("RuntimeError: the user's own bug"), done.stderr
    assert "Task was destroyed" not in done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    committed = {int(p): offset for p, offset in json.loads(lines["committed"]).items()}
    handled = set(json.loads(lines["handled"]))
    for partition, offset in committed.items():  # nothing committed that one did not handle
        assert {f"orders/{partition}/{n}" for n in range(offset)} <= handled, partition


def test_the_teardown_is_bounded_when_the_broker_stopped_answering(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(STUCK)
    done = _python(tmp_path, "app.py")
    assert done.returncode == 1, done.stderr
    assert "the group's stop (its final advances, closing the producer) took" in done.stderr
    assert done.stderr.rstrip().endswith("RuntimeError: the user's own bug"), done.stderr


def test_sys_exit_in_a_handler_is_the_exit_status_of_ackgate_run(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(EXITS)
    done = _python(tmp_path, "-m", "ackgate", "run", "app:service")
    assert done.returncode == 3, done.stderr
    assert "handler 'migrator' raised SystemExit(3) on message id=orders/0/5" in done.stderr
    assert "service 'orders' raised SystemExit(3): the process exits with it" in done.stderr
