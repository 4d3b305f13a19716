"""``ackgate run --health-port``: ``GET /livez``, ``GET /readyz``, ``GET /status.json``
and the status page ``GET /`` for an orchestrator and an operator.

The server is asyncio's (:func:`asyncio.start_server`) on an event loop of its own,
in a thread of its own, so that it can tell a blocked service loop from a live one:
``/livez`` is 200 when the services' loop runs a callback it is sent within
:data:`LOOP_DEADLINE` seconds, 503 otherwise. ``/readyz`` is computed *on* the
services' loop (services' statistics are not thread-safe) under the same deadline:
200 when every service has a live group that is not paused and whose upstream is
connected, else 503 with a JSON body naming each service that is not ready and why.
Both answer with a JSON body (``{"status": "ok", ...}`` or ``{"status": "unavailable",
...}``); ``/readyz``'s names each service's oldest un-advanced message, which does
not make it unready by itself.

What a connection costs is bounded: no thread per connection, at most
:data:`MAX_CONNECTIONS` open at once (more are closed at once), a request must
arrive within :data:`READ_TIMEOUT` seconds and fit in :data:`MAX_REQUEST_BYTES`, the
listen backlog is :data:`BACKLOG`, and a client that hangs up is no error. Each
answer closes its connection (``Connection: close``).

With ``ackgate run --workers N`` the parent serves the port and asks each worker's
own server (on a loopback port the worker reports at start): see
:mod:`ackgate._operating.worker_processes`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ackgate._operating.status import STATUS_PAGE, service_status

if TYPE_CHECKING:
    from ackgate._service.service import Service

#: Seconds the event loop has to answer before ``/livez`` (and ``/readyz``) say 503.
LOOP_DEADLINE = 1.0
#: Seconds a client has to send its request, headers included.
READ_TIMEOUT = 5.0
#: Connections open at once; one more is closed as soon as it is accepted.
MAX_CONNECTIONS = 512
#: The listen backlog (the kernel caps it at ``net.core.somaxconn``).
BACKLOG = 1024
#: A request line and headers larger than this are refused (431).
MAX_REQUEST_BYTES = 16 * 1024

#: A probe: ``(ok, JSON-able details)``; awaited on the health server's loop.
Probe = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]

_BLOCKED = "the event loop did not answer within {:g}s (blocked)"
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}
_REASONS |= {408: "Request Timeout", 400: "Bad Request", 503: "Service Unavailable"}


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


def _oldest(services: Sequence[Service]) -> list[dict[str, Any]]:
    """Each service's oldest un-advanced message, for ``/readyz`` (caller: their loop)."""
    named = []
    for service in services:
        oldest = service_status(service.stats())["oldest"]
        if oldest is not None:
            named.append({"service": repr(service.key), **oldest})
    return named


def loop_probes(loop: asyncio.AbstractEventLoop, services: Sequence[Service]) -> dict[str, Probe]:
    """``/livez``, ``/readyz`` and ``/status.json`` of ``services`` running on ``loop``."""

    async def ask(question: Callable[[], Any]) -> tuple[bool, Any]:
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def on_loop() -> None:
            try:
                answer.set_result(question())
            except Exception as error:  # a bug: say so rather than hang the probe
                answer.set_exception(error)

        try:
            loop.call_soon_threadsafe(on_loop)
        except RuntimeError:  # the loop is closed
            return False, None
        try:
            async with asyncio.timeout(LOOP_DEADLINE):
                return True, await asyncio.wrap_future(answer)
        except TimeoutError:
            return False, None

    blocked = {"status": "unavailable", "reason": _BLOCKED.format(LOOP_DEADLINE)}

    async def livez() -> tuple[bool, dict[str, Any]]:
        answered, _ = await ask(lambda: None)
        return (True, {"status": "ok"}) if answered else (False, blocked)

    async def readyz() -> tuple[bool, dict[str, Any]]:
        answered, found = await ask(lambda: (not_ready(services), _oldest(services)))
        if not answered:
            return False, blocked
        problems, oldest = found
        if problems:
            return False, {"status": "unavailable", "not_ready": problems, "oldest": oldest}
        return True, {"status": "ok", "oldest": oldest}

    async def status() -> tuple[bool, dict[str, Any]]:
        answered, found = await ask(
            lambda: (not_ready(services), [service_status(s.stats()) for s in services])
        )
        if not answered:
            return False, dict(blocked, services=[])
        problems, described = found
        return not problems, {
            "status": "unavailable" if problems else "ok",
            "not_ready": problems,
            "services": described,
        }

    return {"/livez": livez, "/readyz": readyz, "/status.json": status}


class HealthServer:
    """``probes`` (path -> :data:`Probe`) and the status page at ``/`` over HTTP/1.1 on
    ``(host, port)``, served by an event loop in a daemon thread of its own.

    ``port`` 0 picks a free port (:attr:`port` tells which). ``OSError`` when the
    port cannot be bound (raised here, before anything is served). :meth:`close`
    stops it.
    """

    def __init__(self, host: str, port: int, probes: Mapping[str, Probe]) -> None:
        self._probes = dict(probes)
        self._open = 0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        started: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(host, port, started), name="ackgate health", daemon=True
        )
        self._thread.start()
        self.port: int = started.result()  # the bind's OSError is raised here

    def _serve(self, host: str, port: int, started: concurrent.futures.Future[int]) -> None:
        try:
            self._loop.run_until_complete(self._main(host, port, started))
        finally:
            self._loop.close()
            if not started.done():  # pragma: no cover - _main sets it before anything
                started.set_exception(RuntimeError("the health server ended at start"))

    async def _main(self, host: str, port: int, started: concurrent.futures.Future[int]) -> None:
        self._stop = asyncio.Event()
        try:
            server = await asyncio.start_server(
                self._connection, host, port, backlog=BACKLOG, limit=MAX_REQUEST_BYTES
            )
        except OSError as error:
            # asyncio's message repeats the address; the caller names the port itself.
            errno = error.errno
            started.set_exception(OSError(errno, os.strerror(errno)) if errno else error)
            return
        started.set_result(server.sockets[0].getsockname()[1])
        async with server:
            await self._stop.wait()
            server.close()
        # Connections in progress end with their timeouts; the loop cancels them now.
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open <= MAX_CONNECTIONS:
                code, body, content_type = await self._answer(reader)
                head = (
                    f"HTTP/1.1 {code} {_REASONS.get(code, '')}\r\n"
                    f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                    "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
                )
                writer.write(head.encode("latin-1") + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up: nothing to answer, nothing to report
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, bytes, str]:
        """``(status, body, content type)`` of the request ``reader`` brings."""
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                request = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            return _json(408, {"status": f"no request within {READ_TIMEOUT:g}s"})
        except asyncio.LimitOverrunError:
            return _json(431, {"status": f"request larger than {MAX_REQUEST_BYTES} bytes"})
        method, _, rest = request.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0].decode("latin-1")
        if method != b"GET":
            return _json(405, {"status": "only GET"})
        if path == "/":
            return 200, STATUS_PAGE, "text/html; charset=utf-8"
        probe = self._probes.get(path)
        if probe is None:
            return _json(404, {"status": "not found", "paths": ["/", *sorted(self._probes)]})
        ok, body = await probe()
        return _json(200 if ok else 503, body)

    def close(self) -> None:
        """Stop serving and release the port. Blocks for at most a second."""
        stop = self._stop
        if stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=1.0)


def _json(code: int, body: dict[str, Any]) -> tuple[int, bytes, str]:
    return code, json.dumps(body).encode() + b"\n", "application/json"
