"""docs/production.md#service-options and docs/failure-semantics.md#broker-outages CLI: ``ackgate
run MODULE:ATTR`` as a subprocess, one test per row of its exit-code table. SIGTERM stops gracefully
(exit 0, every finished message committed, nothing else); a second signal stops at once (1); a
service that fails (its producer factory raised, ``--max-restarts`` reached) or a module that raises
while imported exits 1 with one line and no traceback, the other services stopped gracefully first;
a bad command line or target exits 2 with one line."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import pytest

from ackgate._operating.args import BadTarget
from ackgate._operating.run_command import GC_THRESHOLD, load_services, tune_gc

REPO = Path(__file__).resolve().parents[2]

APP = """
import asyncio
import atexit
import json

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders", partitions=4)
for n in range(5000):
    broker.publish("orders", b"m%d" % n)

service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "app"))


@service.handler("slow", concurrency=4)  # one call per partition at a time, in order
async def slow(message: Message) -> None:
    await asyncio.sleep(0.005)
    print("done", message.id, flush=True)


@service.handler("fast", batch_size=50, batch_wait=0.01)
async def fast(messages: list[Message]) -> None:
    pass


@atexit.register
def report() -> None:  # runs once run() has returned and the loop is gone
    print("committed", json.dumps(broker.committed("orders", "app")), flush=True)
"""

HANGS = """
import asyncio

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders")
broker.publish("orders", b"one")
services = [Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "app"))]


@services[0].handler("stuck")
async def stuck(message: Message) -> None:
    print("started", flush=True)
    await asyncio.Event().wait()
"""


def ackgate_run(cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "ackgate", "run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    """The rest of its stdout and stderr once it exited by itself; killed if it does not
    within 60 s. Read through the pipes' text streams, never ``communicate()``: that reads
    the file descriptors directly, so it loses the lines a ``read_until`` on the stream
    already read ahead into its buffer (a loaded machine delivers many lines per read)."""
    assert process.stdout is not None and process.stderr is not None
    with ThreadPoolExecutor(max_workers=2) as pool:
        out = pool.submit(process.stdout.read)
        err = pool.submit(process.stderr.read)
        try:
            process.wait(timeout=60)
        finally:
            process.kill()  # nothing once it exited; else it ends the reads
        return out.result(), err.result()


def read_until(stream: IO[str] | None, text: str, lines: list[str]) -> None:
    assert stream is not None
    for line in stream:
        lines.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} never came; got {lines[-5:]!r}")


def test_finish_keeps_the_lines_read_until_read_ahead() -> None:
    # One write: read_until's first read takes all 100 lines, and yields 40.
    child = "import os; os.write(1, b''.join(b'line %d\\n' % n for n in range(100)))"
    process = subprocess.Popen(
        [sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    read_until(process.stdout, "line 39", lines)
    out, _ = finish(process)
    assert [*lines, *out.splitlines(keepends=True)] == [f"line {n}\n" for n in range(100)]


def test_sigterm_stops_gracefully_and_commits_exactly_what_finished(tmp_path: Path) -> None:
    (tmp_path / "orders_app.py").write_text(APP)
    process = ackgate_run(tmp_path, "orders_app:service", "--shutdown-timeout", "20")
    try:
        lines: list[str] = []
        for _ in range(40):
            read_until(process.stdout, "done ", lines)
        process.send_signal(signal.SIGTERM)
        out, err = finish(process)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "stopping gracefully" in err
    done: dict[int, set[int]] = defaultdict(set)
    committed: dict[int, int] = {}
    for line in [*lines, *out.splitlines()]:
        if line.startswith("done "):
            _, partition, offset = line.split()[1].split("/")
            done[int(partition)].add(int(offset))
        elif line.startswith("committed "):
            committed = {int(p): o for p, o in json.loads(line.split(" ", 1)[1]).items()}
    # Calls in progress at SIGTERM finished and were committed; nothing unfinished was.
    for partition in range(4):
        assert done[partition] == set(range(committed[partition])), partition
    assert 40 <= sum(committed.values()) < 5000


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text(HANGS)
    process = ackgate_run(tmp_path, "hangs:services", "--shutdown-timeout", "600")
    try:
        read_until(process.stdout, "started", [])
        process.send_signal(signal.SIGINT)
        read_until(process.stderr, "stopping gracefully", [])
        process.send_signal(signal.SIGINT)
        _, err = finish(process)
    finally:
        process.kill()
    assert process.returncode == 1
    assert "again: stopping at once" in err


def test_a_bad_target_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text(HANGS)
    for target, message in [
        ("nope:nothing", "cannot import 'nope': no module named 'nope'"),
        ("hangs:nothing", "'hangs:nothing': 'hangs' has no attribute 'nothing'"),
        ("hangs:broker", "'hangs:broker' is a MemoryBroker, not a Service"),
        ("hangs", "'hangs' is not MODULE:ATTR"),
    ]:
        process = ackgate_run(tmp_path, target)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 2, (target, err)
        assert err.startswith("ackgate run: ") and message in err, err
        assert len(err.splitlines()) == 1 and "Traceback" not in err


MISCONFIGURED = """
import os

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders")
service = Service(
    "orders",
    producer=lambda: MemoryStreamProducer(broker, os.environ["ORDERS_TOPIC"], "app"),
)


@service.handler("h")
async def handle(message: Message) -> None:
    pass
"""

ORDERS_SLOW = """
import asyncio
import atexit
import json
from collections.abc import AsyncIterator
from typing import Any

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

broker = MemoryBroker()
broker.create_topic("orders")
broker.create_topic("audit")
for n in range(3):
    broker.publish("orders", b"m%d" % n)
started = asyncio.Event()
orders = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "app"))


@orders.handler("slow")
async def slow(message: Message) -> None:
    print("started", message.id, flush=True)
    started.set()
    await asyncio.sleep(0.5)
    print("finished", message.id, flush=True)


@atexit.register
def report() -> None:
    print("committed", json.dumps(broker.committed("orders", "app")), flush=True)
"""

ONE_FAILS = (
    ORDERS_SLOW
    + """
class Unreachable(MemoryStreamProducer):
    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        await started.wait()  # fails once an orders call is in progress
        raise ConnectionError("audit broker unreachable")
        yield


audit = Service("audit", producer=lambda: Unreachable(broker, "audit", "app"))
services = [orders, audit]


@audit.handler("h")
async def handle(message: Message) -> None:
    pass
"""
)

ONE_EXITS = (
    ORDERS_SLOW
    + """
class Exits(Service):
    async def run(self) -> None:  # as a handler's SystemExit leaves run()
        await started.wait()
        raise SystemExit(3)


services = [orders, Exits("audit", producer=lambda: MemoryStreamProducer(broker, "audit", "app"))]
"""
)


def test_a_producer_factory_error_exits_1_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "misconfigured.py").write_text(MISCONFIGURED)
    process = ackgate_run(tmp_path, "misconfigured:service")
    _, err = finish(process)
    assert process.returncode == 1, err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "service 'orders' failed: KeyError: 'ORDERS_TOPIC'" in errors[0]
    assert "raised by the producer factory" in errors[0] and "not retried" in errors[0]
    assert "restarting" not in err

    process = ackgate_run(tmp_path, "misconfigured:service", "--log-level", "DEBUG")
    _, err = finish(process)
    assert process.returncode == 1
    assert "Traceback" in err and 'os.environ["ORDERS_TOPIC"]' in err


def test_max_restarts_fails_the_service_and_stops_the_others_gracefully(tmp_path: Path) -> None:
    (tmp_path / "one_fails.py").write_text(ONE_FAILS)
    process = ackgate_run(tmp_path, "one_fails:services", "--max-restarts", "0")
    out, err = finish(process)
    assert process.returncode == 1, err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "service 'audit' failed: StreamTerminated" in errors[0]
    assert "audit broker unreachable" in errors[0] and "restart_limit=0" in errors[0]
    assert "stopping the other services gracefully" in err
    # The call in progress on orders finished and was committed; nothing else started.
    assert out.splitlines() == ["started orders/0/0", "finished orders/0/0", 'committed {"0": 1}']


def test_a_service_raising_system_exit_stops_the_others_gracefully_and_exits_with_its_code(
    tmp_path: Path,
) -> None:
    (tmp_path / "one_exits.py").write_text(ONE_EXITS)
    process = ackgate_run(tmp_path, "one_exits:services")
    out, err = finish(process)
    assert process.returncode == 3, err
    assert "service 'audit' raised SystemExit(3)" in err and "Traceback" not in err
    assert out.splitlines() == ["started orders/0/0", "finished orders/0/0", 'committed {"0": 1}']


def test_a_module_that_raises_while_imported_exits_1_with_one_line(tmp_path: Path) -> None:
    """Not a bad target: the module exists and has a bug or a bad setting of its own."""
    (tmp_path / "broken.py").write_text("import a_dependency_nobody_installed\n")
    (tmp_path / "invalid.py").write_text(
        "from ackgate import Service\nservice = Service('s', producer=list, restart_limit=-1)\n"
    )
    for target, message in [
        ("broken:service", "importing 'broken' failed: ModuleNotFoundError: No module named "),
        ("invalid:service", "importing 'invalid' failed: ValueError: restart_limit must be"),
    ]:
        process = ackgate_run(tmp_path, target)
        _, err = finish(process)
        assert process.returncode == 1, err
        assert err.startswith("ackgate run: ") and message in err, err
        assert len(err.splitlines()) == 1 and "Traceback" not in err

    process = ackgate_run(tmp_path, "broken:service", "--log-level", "DEBUG")
    _, err = finish(process)
    assert process.returncode == 1
    assert "Traceback" in err and "a_dependency_nobody_installed" in err


def test_a_missing_adapter_is_a_bad_target_naming_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter is not installed in this environment (``None`` in ``sys.modules``
    makes its import fail as if it were absent): one line saying what to install."""
    (tmp_path / "on_kafka.py").write_text("from ackgate_kafka import KafkaStreamProducer\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ackgate_kafka", None)
    with pytest.raises(BadTarget) as raised:
        load_services(["on_kafka:service"])
    assert str(raised.value) == (
        "cannot import 'on_kafka': the kafka adapter ('ackgate_kafka') is not installed; "
        "pip install 'ackgate[kafka]' (from a checkout: pip install ./adapters/kafka)"
    )


def test_a_bad_command_line_exits_2(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text(HANGS)
    for args, message in [
        (["hangs:services", "--max-restarts", "-1"], "--max-restarts: must be an int >= 0, got -1"),
        (["hangs:services", "--max-restarts", "two"], "--max-restarts: not an integer: 'two'"),
        (["hangs:services", "--shutdown-timeout", "soon"], "--shutdown-timeout: not a number"),
        ([], "the following arguments are required: MODULE:ATTR"),
    ]:
        process = ackgate_run(tmp_path, *args)
        _, err = finish(process)
        assert process.returncode == 2, (args, err)
        assert message in err.splitlines()[-1] and "Traceback" not in err, err


def test_a_worker_whose_parent_is_gone_stops_gracefully_by_itself(tmp_path: Path) -> None:
    """A ``--workers`` child names its parent in its environment; once that is no longer
    its parent (the parent was killed), it stops as after SIGTERM. Here the named
    parent is a pid no process has, as if the parent had died before it looked."""
    (tmp_path / "orders_app.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACKGATE_WORKER_PARENT": str(2**31)}
    process = subprocess.Popen(
        [sys.executable, "-m", "ackgate", "run", "orders_app:service"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = finish(process)
    assert process.returncode == 0, err
    assert "the parent process is gone: stopping gracefully" in err
    assert "Traceback" not in err


GC_APP = """
import gc
import os
import sys

from ackgate import Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

if os.environ.get("APP_GC_THRESHOLD"):  # the application sets the collector up itself
    gc.set_threshold(int(os.environ["APP_GC_THRESHOLD"]), 10, 10)
else:  # as CPython 3.11 to 3.13 start
    gc.set_threshold(700, 10, 10)
broker = MemoryBroker()
broker.create_topic("orders")
broker.publish("orders", b"one")
service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "app"))


@service.handler("h")
async def handle(message: Message) -> None:
    print("threshold", *gc.get_threshold(), flush=True)
    sys.exit(0)  # the service stops gracefully, ackgate run exits 0
"""


@pytest.mark.parametrize(
    ("app_threshold", "expected"), [(None, "10000 10 10"), ("2000", "2000 10 10")]
)
def test_ackgate_run_raises_the_gc_threshold_unless_the_application_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app_threshold: str | None, expected: str
) -> None:
    """A young collection every 700 container objects (CPython's default) costs a
    consumer ~29 % of its CPU on Kafka; ``ackgate run`` collects every 10,000 instead,
    and leaves a module's own setting alone."""
    monkeypatch.delenv("APP_GC_THRESHOLD", raising=False)
    if app_threshold is not None:
        monkeypatch.setenv("APP_GC_THRESHOLD", app_threshold)
    (tmp_path / "gc_app.py").write_text(GC_APP)
    out, err = finish(ackgate_run(tmp_path, "gc_app:service"))
    assert f"threshold {expected}\n" in out, (out, err)


def test_tune_gc_leaves_a_disabled_or_configured_collector_alone() -> None:
    before = gc.get_threshold()
    enabled = gc.isenabled()
    try:
        gc.set_threshold(700, 10, 10)
        gc.disable()
        assert not tune_gc() and gc.get_threshold() == (700, 10, 10)
        gc.enable()
        gc.set_threshold(700, 5, 10)
        assert not tune_gc() and gc.get_threshold() == (700, 5, 10)
        gc.set_threshold(700, 10, 10)
        assert tune_gc() and gc.get_threshold() == (GC_THRESHOLD, 10, 10)
    finally:
        gc.set_threshold(*before)
        if enabled:
            gc.enable()
        else:
            gc.disable()


def test_a_mistyped_attribute_is_answered_with_did_you_mean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "typo_app.py").write_text(
        "from ackgate import Service\n"
        "from ackgate.testing import ScriptedProducer\n"
        "service = Service('k', producer=ScriptedProducer)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BadTarget, match=r"has no attribute 'servce'; did you mean 'service'\?"):
        load_services(["typo_app:servce"])
    with pytest.raises(BadTarget, match=r"has no attribute 'zzz'$"):
        load_services(["typo_app:zzz"])


def test_the_otel_check_of_metrics_port_runs_before_any_worker_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ackgate._operating.run_command as run_module
    from ackgate._operating.cli import main

    def no_workers(opts: object) -> int:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(run_module, "run_workers", no_workers)
    # In-process: the root logger's handlers (pytest's) must not get ackgate run's setup.
    monkeypatch.setattr(run_module, "configure_logging", lambda *args, **kwargs: None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    status = main(["run", "nope:service", "--workers", "2", "--metrics-port", "9464"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("pip install 'ackgate[otel]'") == 1
    assert "prometheus_client is missing" in err
