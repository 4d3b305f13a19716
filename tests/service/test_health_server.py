"""docs/production.md#probes-health-port: the health server itself. 500 idle connections cost no
thread and do not keep a probe from its answer; a connection that sends nothing is answered 408
after the read timeout; a client hanging up leaves no traceback; ``/livez`` says "blocked" while
the loop it probes is blocked, from its own loop."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ackgate._operating import health
from ackgate._operating.health import HealthServer, loop_probes


def get(port: int, path: str) -> tuple[int, dict[str, object] | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            data = reply.read().decode()
            return reply.status, json.loads(data) if path != "/" else data
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread of its own: the loop the probes ask."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_idle_connections_cost_no_thread_and_probes_still_answer(
    loop_thread: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "READ_TIMEOUT", 1.0)
    server = HealthServer("127.0.0.1", 0, loop_probes(loop_thread, []))
    idle: list[socket.socket] = []
    try:
        threads = threading.active_count()
        for _ in range(500):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        assert get(server.port, "/livez") == (200, {"status": "ok"})
        assert threading.active_count() == threads  # a thread per connection: 500 more
        # An idle connection is answered 408 once the read timeout ran out, and closed.
        idle[0].settimeout(5)
        answer = idle[0].recv(4096)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
    finally:
        for sock in idle:
            sock.close()
        server.close()


def test_a_client_hanging_up_leaves_no_traceback(
    loop_thread: asyncio.AbstractEventLoop, capfd: pytest.CaptureFixture[str]
) -> None:
    server = HealthServer("127.0.0.1", 0, loop_probes(loop_thread, []))
    try:
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            sock.sendall(b"GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.close()  # a reset, before the answer is written
        assert get(server.port, "/livez")[0] == 200
    finally:
        server.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def test_livez_says_blocked_while_the_probed_loop_is_blocked(
    loop_thread: asyncio.AbstractEventLoop,
) -> None:
    server = HealthServer("127.0.0.1", 0, loop_probes(loop_thread, []))
    blocking = threading.Event()

    def block() -> None:
        blocking.set()
        time.sleep(2.5)  # blocks the probed loop, as a handler without await would

    try:
        loop_thread.call_soon_threadsafe(block)
        assert blocking.wait(5)
        code, body = get(server.port, "/livez")
        assert code == 503
        assert isinstance(body, dict) and "blocked" in str(body["reason"])
        code, page = get(server.port, "/")
        assert code == 200 and "<title>ackgate status</title>" in str(page)  # no loop needed
    finally:
        server.close()


def test_the_port_in_use_is_an_oserror_at_construction() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            HealthServer("127.0.0.1", taken.getsockname()[1], {})
