"""docs/production.md#the-status-page: ``GET /`` on the health port, rendered by a real headless
Chromium (Debian's ``chromium`` package; .ci/run installs it). The page draws each service from
``/status.json``: its handlers with counts and how far behind they are, the oldest message and
who holds it, the upstream state. Checked in the DOM Chromium dumps after the page's script ran,
and a screenshot is produced. Chromium missing is a failure, not a skip."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackgate import Message, Service
from ackgate._operating.health import HealthServer, loop_probes
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "chromium is not installed: apt-get install chromium"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    """A service on a loop of its own with "slow" holding message 3, its health port."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = MemoryBroker()
    broker.create_topic("orders", 1)
    service = Service("orders", producer=lambda: MemoryStreamProducer(broker, "orders", "g"))
    release = asyncio.Event()

    @service.handler("fast")
    async def fast(message: Message) -> None:
        pass

    @service.handler("slow")
    async def slow(message: Message) -> None:
        if message.body == b"3":
            await release.wait()

    async def start() -> None:
        for n in range(6):
            broker.publish("orders", str(n).encode(), key=f"key-{n}")
        asyncio.get_running_loop().create_task(service.run())

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    server = HealthServer("127.0.0.1", 0, loop_probes(loop, [service]))
    try:
        yield server.port
    finally:
        server.close()

        async def stop() -> None:
            release.set()
            await service.stop(5)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_the_status_page_renders_in_chromium(served: int, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{served}/"
    # The page draws what /status.json says; wait until the message is held there.
    for _ in range(200):
        with urllib.request.urlopen(url + "status.json", timeout=5) as reply:
            status = json.loads(reply.read())
        if status["services"][0]["oldest"] is not None:
            break
    dom = chromium("--virtual-time-budget=3000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr
    page = dom.stdout
    assert '<section class="service" data-service="orders">' in page, page
    assert "oldest message: " in page and "held by slow" in page, page
    assert "key key-" in page
    assert "upstream connected" in page
    assert "<th>handler</th><th>handled</th>" in page
    assert "<td>fast</td><td>6</td>" in page  # "fast" handled all six messages
    shot = tmp_path / "status.png"
    done = chromium("--window-size=900,600", f"--screenshot={shot}", url)
    assert done.returncode == 0, done.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 5_000  # a page drawn, not an empty image
