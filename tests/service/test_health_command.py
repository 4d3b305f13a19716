"""docs/production.md#watching-it health endpoints of ``ackgate run --health-port``, over real HTTP
against the command as a subprocess: ``/readyz`` goes to 503 when a roster member is missing and
when the broker is down, and back to 200; ``/livez`` fails while the loop is blocked. Metrics:
``--metrics-port`` scraped over HTTP and parsed as Prometheus text, with no ``otel_scope_*``
labels."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

# A stream that never ends (a message every 20 ms); files in $CONTROL steer it:
# "down": the broker is unreachable; "hang": the "slow" handler hangs, ignoring
# cancellation (its roster seat stays force-failed); "block": one call blocks the loop.
APP = """
import asyncio
import os
import time

from ackgate import Message, Service, SharedStreamProducer

CONTROL = os.environ["CONTROL"]


def flag(name):
    return os.path.exists(os.path.join(CONTROL, name))


class Ticker(SharedStreamProducer):
    async def open_stream(self):
        n = 0
        while True:
            if flag("down"):
                raise ConnectionError("broker unreachable (test)")
            n += 1
            yield b"tick %d" % n, n
            await asyncio.sleep(0.02)

    def get_advance_lane(self, payload):
        return 0

    async def advance(self, batch):
        pass


service = Service(
    "ticks", producer=Ticker, ack_timeout=0.3, restart_backoff=0.05, max_restart_backoff=0.1
)


@service.handler("slow")
async def slow(message: Message) -> None:
    while flag("hang"):
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            pass  # a hung handler: its seat stays force-failed while it hangs


@service.handler("fast")
async def fast(message: Message) -> None:
    if flag("block"):
        os.remove(os.path.join(CONTROL, "block"))
        time.sleep(3)  # blocks the event loop
"""


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def until(check: Callable[[], Any], what: str, limit: float = 20.0) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"not within {limit}s: {what}")


@pytest.fixture
def command(
    tmp_path: Path,
) -> Iterator[Callable[..., tuple[subprocess.Popen[str], dict[str, int]]]]:
    started: list[subprocess.Popen[str]] = []

    def start(*options: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
        (tmp_path / "app.py").write_text(APP)
        control = tmp_path / "control"
        control.mkdir(exist_ok=True)
        child = subprocess.Popen(
            [sys.executable, "-m", "ackgate", "run", "app:service", *options],
            cwd=tmp_path,
            env=dict(os.environ, CONTROL=str(control)),
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(child)
        ports: dict[str, int] = {}
        lines: list[str] = []
        assert child.stderr is not None
        for line in child.stderr:
            lines.append(line)
            found = re.search(r"(health endpoints|metrics).* port (\d+)", line)
            if found:
                ports["metrics" if found[1] == "metrics" else "health"] = int(found[2])
            if "group started" in line:
                break
        else:
            raise AssertionError("ackgate run ended early:\n" + "".join(lines))
        # Keep reading stderr, so the child never blocks on a full pipe.
        threading.Thread(target=child.stderr.read, daemon=True).start()
        return child, ports

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


def test_readyz_and_livez(
    command: Callable[..., tuple[subprocess.Popen[str], dict[str, int]]], tmp_path: Path
) -> None:
    child, ports = command("--health-port", "0")
    port = ports["health"]
    control = tmp_path / "control"
    until(lambda: get(port, "/readyz")[0] == 200, "ready at start")
    assert json.loads(get(port, "/livez")[1]) == {"status": "ok"}

    (control / "hang").touch()
    _code, body = until(
        lambda: (reply := get(port, "/readyz"))[0] == 503 and reply, "503 with slow missing"
    )
    (problem,) = json.loads(body)["not_ready"]
    assert problem["service"] == "'ticks'"
    assert "roster member(s) missing: slow" in problem["reason"]
    (control / "hang").unlink()
    until(lambda: get(port, "/readyz")[0] == 200, "ready again once slow is back")

    (control / "down").touch()
    _code, body = until(
        lambda: (reply := get(port, "/readyz"))[0] == 503 and reply, "503 with the broker down"
    )
    assert "no live group" in json.loads(body)["not_ready"][0]["reason"]
    (control / "down").unlink()
    until(lambda: get(port, "/readyz")[0] == 200, "ready again once the broker is back")

    (control / "block").touch()
    _code, body = until(lambda: (reply := get(port, "/livez"))[0] == 503 and reply, "livez 503")
    assert "blocked" in json.loads(body)["reason"]
    until(lambda: get(port, "/livez")[0] == 200, "live again once the loop runs")

    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0


def test_metrics_port_serves_prometheus_text(
    command: Callable[..., tuple[subprocess.Popen[str], dict[str, int]]],
) -> None:
    child, ports = command("--metrics-port", "0")

    def handled() -> dict[str, float]:
        families = {
            family.name: family
            for family in text_string_to_metric_families(get(ports["metrics"], "/metrics")[1])
        }
        counts = {
            sample.labels["ackgate_handler"]: sample.value
            for sample in families["ackgate_handler_messages"].samples
            if sample.name.endswith("_total") and sample.labels["ackgate_outcome"] == "handled"
        }
        return counts if len(counts) == 2 and min(counts.values()) >= 5 else {}

    assert set(until(handled, "both handlers counted")) == {"slow", "fast"}
    families = {
        f.name: f for f in text_string_to_metric_families(get(ports["metrics"], "/metrics")[1])
    }
    for name in (
        "messaging_process_duration_seconds",
        "ackgate_group_outstanding",
        "ackgate_group_upstream_connected",
        "ackgate_group_paused",
        "ackgate_group_advances",
    ):
        assert name in families, sorted(families)
    (live,) = families["ackgate_group_live"].samples
    assert live.value == 1 and live.labels["ackgate_service"] == "ticks"
    # No otel_scope_* labels: ackgate is the only scope, they are noise on every series.
    labels = {label for f in families.values() for s in f.samples for label in s.labels}
    assert not [label for label in labels if label.startswith("otel_scope")], sorted(labels)
    # Per handler, how far it is behind what was read (the lag of the handler).
    behind = {s.labels["ackgate_handler"] for s in families["ackgate_handler_behind"].samples}
    assert behind == {"slow", "fast"}
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0
