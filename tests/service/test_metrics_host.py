"""``ackgate run --metrics-host``: the metrics endpoint listens where it is told, apart
from ``--health-host`` (docs/production.md#security)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

APP = """
import asyncio
from ackgate import Service, SharedStreamProducer


class Idle(SharedStreamProducer):
    async def open_stream(self):
        await asyncio.Event().wait()
        yield

    def get_advance_lane(self, payload):
        return 0

    async def advance(self, batch):
        pass


service = Service("idle", producer=Idle)


@service.handler("h")
async def handle(message) -> None:
    pass
"""


def scrape(host: str, port: int) -> int:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as reply:
        status: int = reply.status
        return status


def test_metrics_host_is_where_the_metrics_listen(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    hosts = ["--metrics-host", "127.0.0.2", "--health-host", "127.0.0.1"]
    child = subprocess.Popen(
        [sys.executable, "-m", "ackgate", "run", "app:service", "--metrics-port", "0", *hosts],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stderr is not None
        port = None
        lines = []
        for line in child.stderr:
            lines.append(line)
            found = re.search(
                r"metrics in Prometheus text format on port (\d+) \(address (\S+)\)", line
            )
            if found:
                port = int(found[1])
                assert found[2] == "127.0.0.2"
                break
        assert port is not None, "".join(lines)
        threading.Thread(target=child.stderr.read, daemon=True).start()
        assert scrape("127.0.0.2", port) == 200
        with pytest.raises(urllib.error.URLError):
            scrape("127.0.0.1", port)  # not the health host, not every interface
    finally:
        child.kill()
        child.wait()
