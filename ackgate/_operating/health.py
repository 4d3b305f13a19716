"""``ackgate run --health-port``: ``GET /livez`` and ``GET /readyz`` for an orchestrator.

The server runs in a thread of its own, so that it can tell a blocked event loop
from a live one: ``/livez`` is 200 when the loop runs a callback it is sent within
:data:`LOOP_DEADLINE` seconds, 503 otherwise. ``/readyz`` is computed *on* the loop
(services' statistics are not thread-safe) under the same deadline: 200 when every
service has a live group that is not paused and whose upstream is connected, else
503 with a JSON body naming each service that is not ready and why. Both answer
with a JSON body (``{"status": "ok"}`` or ``{"status": "unavailable", ...}``).

With ``ackgate run --workers N`` the parent serves the port and asks each worker's
own server (on a loopback port the worker reports at start): see
:mod:`ackgate._operating.worker_processes`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackgate._service.service import Service

#: Seconds the event loop has to answer before ``/livez`` (and ``/readyz``) say 503.
LOOP_DEADLINE = 1.0

#: A probe: ``(ok, JSON-able details)``; called in the server's thread.
Probe = Callable[[], tuple[bool, dict[str, Any]]]


def not_ready(services: Sequence[Service]) -> list[dict[str, Any]]:
    """Per service that is not ready: ``{"service": repr(key), "reason": ...}``.

    Caller: the loop the services run on.
    """
    problems = []
    for service in services:
        stats = service.stats()
        reason = None
        group = stats.group
        if stats.state != "running":
            reason = f"service is {stats.state}"
        elif group is None and stats.refused is not None:
            reason = f"the broker refused the service: {stats.refused} (retrying)"
        elif group is None:
            reason = (
                f"no live group (restarting after the group ended; restarts: {stats.restarts})"
                if stats.restarts
                else "no live group yet (starting)"
            )
        elif not group.upstream_connected:
            since = group.upstream_down_since
            reason = "upstream (the broker) unreachable" + (
                "" if since is None else f" since {since}"
            )
        elif group.paused:
            missing = ", ".join(str(member) for member in group.missing) or "?"
            reason = f"paused: roster member(s) missing: {missing}"
        if reason is not None:
            problems.append({"service": repr(service.key), "reason": reason})
    return problems


def loop_probes(
    loop: asyncio.AbstractEventLoop, services: Sequence[Service]
) -> tuple[Probe, Probe]:
    """``(livez, readyz)`` probes of ``services`` running on ``loop``."""

    def ask(question: Callable[[], Any]) -> tuple[bool, Any]:
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def on_loop() -> None:
            try:
                answer.set_result(question())
            except Exception as error:  # a bug: say so rather than hang the probe
                answer.set_exception(error)

        try:
            loop.call_soon_threadsafe(on_loop)
            return True, answer.result(timeout=LOOP_DEADLINE)
        except concurrent.futures.TimeoutError:
            return False, None
        except RuntimeError:  # the loop is closed
            return False, None

    def livez() -> tuple[bool, dict[str, Any]]:
        answered, _ = ask(lambda: None)
        if answered:
            return True, {"status": "ok"}
        return False, {
            "status": "unavailable",
            "reason": f"the event loop did not answer within {LOOP_DEADLINE:g}s (blocked)",
        }

    def readyz() -> tuple[bool, dict[str, Any]]:
        answered, problems = ask(lambda: not_ready(services))
        if not answered:
            return False, {
                "status": "unavailable",
                "reason": f"the event loop did not answer within {LOOP_DEADLINE:g}s (blocked)",
            }
        if problems:
            return False, {"status": "unavailable", "not_ready": problems}
        return True, {"status": "ok"}

    return livez, readyz


class HealthServer:
    """``/livez`` and ``/readyz`` over HTTP/1.1 on ``(host, port)``, in a daemon thread.

    ``port`` 0 picks a free port (:attr:`port` tells which). :meth:`close` stops it.
    """

    def __init__(self, host: str, port: int, livez: Probe, readyz: Probe) -> None:
        probes = {"/livez": livez, "/readyz": readyz}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                probe = probes.get(self.path.split("?", 1)[0])
                if probe is None:
                    self._send(404, {"status": "not found", "paths": sorted(probes)})
                    return
                ok, body = probe()
                self._send(200 if ok else 503, body)

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode() + b"\n"
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a probe every few seconds is not worth a log line

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ackgate health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port. Blocks for at most the current request."""
        self._server.shutdown()
        self._server.server_close()
