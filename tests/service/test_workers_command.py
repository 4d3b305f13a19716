"""docs/production.md#watching-it ``ackgate run --workers``: a worker that exits 2 (a bad target:
every restart would fail the same way) stops them all and the parent exits 2, instead of restarting
it forever. A dead worker fails ``/livez``, naming it; a SIGTERM while it waits for its
restart exits 0, and a health port already in use is one line and exit 2 (the exit code
table of docs/production.md#permanent-errors-and-exit-codes). (Workers on a broker:
tests/adapters/kafka/test_kafka_workers.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def test_a_bad_target_stops_every_worker_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ackgate", "run", "nosuchmodule:service", "--workers", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot import 'nosuchmodule'" in done.stderr
    assert "exited 2 (a bad target or option): stopping every worker" in done.stderr
    assert "starting it again" not in done.stderr


# A service that needs no broker; worker 0 SIGKILLs itself as it starts, every time (while
# "die" exists in $CONTROL), so it spends its life in the restart backoff.
DYING_APP = """
import asyncio
import os
import signal

from ackgate import Service, SharedStreamProducer

if os.environ.get("ACKGATE_WORKER") == "0" and os.path.exists(os.environ["CONTROL"] + "/die"):
    os.kill(os.getpid(), signal.SIGKILL)


class Ticker(SharedStreamProducer):
    async def open_stream(self):
        n = 0
        while True:
            n += 1
            yield n, n
            await asyncio.sleep(0.05)

    def get_advance_lane(self, payload):
        return 0

    async def advance(self, batch):
        pass


service = Service("ticks", producer=Ticker)


@service.handler("only")
async def only(message):
    pass
"""


def start_workers(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    (tmp_path / "app.py").write_text(DYING_APP)
    (tmp_path / "control").mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "ackgate", "run", "app:service", "--workers", "2", *options],
        cwd=tmp_path,
        env=dict(os.environ, CONTROL=str(tmp_path / "control")),
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_dead_worker_fails_livez_and_a_sigterm_in_its_backoff_exits_0(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "die").touch()
    parent = start_workers(tmp_path, "--health-port", "0")
    lines: list[str] = []
    try:
        assert parent.stderr is not None
        port = None
        for line in parent.stderr:
            lines.append(line)
            found = re.search(r"health endpoints .* on port (\d+)", line)
            if found and "workers" in line:
                port = int(found[1])
            if "worker 0" in line and "exited with status -9" in line:
                break
        assert port is not None, "".join(lines)
        threading.Thread(target=lambda: lines.extend(parent.stderr or ()), daemon=True).start()
        deadline = time.monotonic() + 20
        # /status.json (the status page's source) has every worker: the live one's services.
        while time.monotonic() < deadline:
            try:
                reply = urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=5)
            except urllib.error.HTTPError as error:
                reply = error
            status = json.loads(reply.read())
            if any(w.get("services") for w in status["workers"]):
                break
            time.sleep(0.05)
        by_worker = {w["worker"]: w for w in status["workers"]}
        assert sorted(by_worker) == [0, 1]
        assert [s["service"] for s in by_worker[1]["services"]] == ["ticks"]
        body: dict[str, object] = {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5):
                    pass  # 200: worker 0 is starting again; ask again
            except urllib.error.HTTPError as error:
                body = json.loads(error.read())
                break
            time.sleep(0.05)
        (dead,) = body["workers"]  # type: ignore[misc]
        assert dead["worker"] == 0 and "worker dead (exited with status -9)" in dead["reason"]
        parent.send_signal(signal.SIGTERM)  # worker 0 is in its backoff right now
        assert parent.wait(timeout=60) == 0, "".join(lines)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_health_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        parent = start_workers(tmp_path, "--health-port", str(port))
        _, err = parent.communicate(timeout=60)
    assert parent.returncode == 2, err
    assert err.splitlines() == [f"ackgate run: --health-port {port}: Address already in use"]
