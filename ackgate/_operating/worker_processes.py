"""``ackgate run --workers N``: N worker processes, each running its own copy of the
services; the broker shares the work among them (a Kafka consumer group, competing
consumers on SQS, Pub/Sub and Service Bus).

The parent imports no service. It starts each worker as ``python -m ackgate run``
with the same targets and options, in a session of its own (a Ctrl-C on the
terminal reaches the parent only, which forwards it: a worker sees one signal, not
two). Then:

- **Signals.** SIGTERM or SIGINT is forwarded to every worker, which stops
  gracefully (``--shutdown-timeout``); a second one is forwarded too (they stop at
  once). The parent returns when every worker has exited: 0 when all exited 0 (a
  worker that was dead, waiting for its restart, counts as stopped: 0).
- **A worker that dies** (any exit while the parent is not stopping) is logged at
  WARNING and started again after a backoff: 1 s, doubling per consecutive death up
  to 30 s, back to 1 s once a worker lived a minute. A worker exiting 2 (a bad
  target or option: every restart would fail the same way) stops them all; the
  parent exits 2.
- **Health.** With ``--health-port``, each worker serves its own ``/livez`` and
  ``/readyz`` on a free loopback port and writes that port to a pipe the parent
  gave it (:data:`REPORT_FD_ENV`); the parent serves the port asked for and asks
  every worker. ``/livez`` is 503 when a running worker's loop does not answer or a
  worker is dead (waiting for its restart); ``/readyz`` is 503 unless every worker is
  up and ready; ``/status.json`` (and the status page ``/``) has every worker's
  services. Bodies name the worker.
- **A health port already in use** is ``OSError`` from :meth:`Workers.run` before any
  worker starts (``ackgate run`` prints one line and exits 2).
- **Metrics.** ``--metrics-port P``: worker ``i`` (from 0) serves on ``P + i``.
- A worker whose parent disappears (killed with SIGKILL) stops gracefully by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ackgate._operating.health import HealthServer, Probe

logger = logging.getLogger("ackgate.workers")

#: Environment of a worker: the file descriptor it writes its health port to.
REPORT_FD_ENV = "ACKGATE_HEALTH_REPORT_FD"
#: Environment of a worker: its index, shown in its log lines.
INDEX_ENV = "ACKGATE_WORKER"
#: Environment of a worker: the parent's pid; the worker stops when it changes.
PARENT_ENV = "ACKGATE_WORKER_PARENT"

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
#: A worker that lived this long resets the backoff of the next death.
HEALTHY_LIFE = 60.0
#: Seconds the parent waits for a worker's health server to answer.
ASK_TIMEOUT = 2.0


class _Worker:
    """One worker slot: its current process and what its health server said."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        #: The worker's health port, once it reported it; ``None`` while (re)starting.
        self.health_port: int | None = None
        self.restarts = 0

    def describe(self) -> dict[str, Any]:
        pid = None if self.process is None else self.process.pid
        return {"worker": self.index, "pid": pid, "restarts": self.restarts}

    def starting(self) -> bool:
        """Its process runs but has not reported its health port yet."""
        return self.process is not None and self.process.returncode is None

    def why_down(self) -> str:
        """Why this worker has no health server to ask, for a probe's body."""
        if self.process is None:
            return "worker not started yet"
        if self.process.returncode is None:
            return "worker starting (no health port reported yet)"
        return f"worker dead (exited with status {self.process.returncode}); restarting"


class Workers:
    """The parent of ``count`` workers, each run as ``command(index)``."""

    def __init__(
        self, command: Sequence[str], count: int, metrics_port: int | None, health: bool
    ) -> None:
        self._command = list(command)
        self._metrics_port = metrics_port
        self._health = health
        self.workers = [_Worker(index) for index in range(count)]
        self._stopping: asyncio.Event | None = None
        self._signals = 0
        self._bad_target = False

    async def run(self, health_host: str | None, health_port: int | None) -> int:
        """Run the workers until a signal stops them; the exit status."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = None
        if health_port is not None:
            # OSError (the port is taken) before any worker started: the caller's one line.
            server = HealthServer(health_host or "0.0.0.0", health_port, self.probes())
            logger.info(
                "health endpoints /livez, /readyz, /status.json and the status page / of "
                "%d workers on port %d",
                len(self.workers),
                server.port,
            )
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        try:
            codes = await asyncio.gather(*(self._keep(worker) for worker in self.workers))
        finally:
            if server is not None:
                server.close()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        if self._bad_target:
            return 2
        return 0 if all(code == 0 for code in codes) else 1

    def _on_signal(self, signum: int) -> None:
        assert self._stopping is not None
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            logger.info("received %s: stopping %d worker(s) gracefully", name, len(self.workers))
        else:
            logger.warning("received %s again: the workers stop at once", name)
        self._stopping.set()
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        for worker in self.workers:
            process = worker.process
            if process is not None and process.returncode is None:
                process.send_signal(signum)

    async def _keep(self, worker: _Worker) -> int:
        """Start ``worker`` again whenever it dies, until the parent stops; its last status."""
        assert self._stopping is not None
        backoff = FIRST_BACKOFF
        while True:
            started = time.monotonic()
            code = await self._life(worker)
            if self._stopping.is_set():
                # Killed by the very signal forwarded to stop it (it came before the
                # worker set up its handlers, while it was starting): stopped, not failed.
                return 0 if code in (-signal.SIGTERM, -signal.SIGINT) else code
            if code == 2:
                logger.error(
                    "worker %d exited 2 (a bad target or option): stopping every worker",
                    worker.index,
                )
                self._bad_target = True
                self._stopping.set()
                self._forward(signal.SIGTERM)
                return code
            if time.monotonic() - started >= HEALTHY_LIFE:
                backoff = FIRST_BACKOFF
            logger.warning(
                "worker %d (pid %s) exited with status %s; starting it again in %gs",
                worker.index,
                worker.process.pid if worker.process else "?",
                code,
                backoff,
            )
            try:
                async with asyncio.timeout(backoff):
                    await self._stopping.wait()
                # Stopped while dead: nothing to stop, and its death was logged and
                # restarted from already; a graceful stop is 0 (the exit code table).
                return 0
            except TimeoutError:
                pass
            backoff = min(backoff * 2, MAX_BACKOFF)
            worker.restarts += 1

    async def _life(self, worker: _Worker) -> int:
        """One process of ``worker``, from start to exit; its exit status."""
        env = dict(os.environ, **{INDEX_ENV: str(worker.index), PARENT_ENV: str(os.getpid())})
        command = list(self._command)
        if self._metrics_port is not None:
            command += ["--metrics-port", str(self._metrics_port + worker.index)]
        read_end = write_end = None
        if self._health:
            read_end, write_end = os.pipe()
            env[REPORT_FD_ENV] = str(write_end)
            command += ["--health-port", "0"]
        try:
            worker.process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                pass_fds=() if write_end is None else (write_end,),
                start_new_session=True,
            )
        finally:
            if write_end is not None:
                os.close(write_end)
        logger.info("worker %d started (pid %d)", worker.index, worker.process.pid)
        loop = asyncio.get_running_loop()
        reported = None
        if read_end is not None:
            reported = loop.run_in_executor(None, _read_port, read_end)
            reported.add_done_callback(lambda done: setattr(worker, "health_port", done.result()))
        try:
            return await worker.process.wait()
        finally:
            if reported is not None:
                await reported  # EOF at the latest when the process exited
            worker.health_port = None  # after the report's callback, which may set it

    def probes(self) -> dict[str, Probe]:
        """``/livez``, ``/readyz`` and ``/status.json`` of the parent: every worker asked
        at once (a blocked worker takes a second to say so; the others are not made to
        wait behind it)."""

        async def ask(path: str) -> list[tuple[_Worker, int | None, dict[str, Any]]]:
            ports = [(worker, worker.health_port) for worker in self.workers]
            answers = await asyncio.gather(
                *(_get(port, path) for _, port in ports if port is not None)
            )
            replies = iter(answers)
            return [
                (worker, None, {}) if port is None else (worker, *next(replies))
                for worker, port in ports
            ]

        async def livez() -> tuple[bool, dict[str, Any]]:
            failing = []
            for worker, code, body in await ask("/livez"):
                if code is None:
                    if worker.starting():
                        continue  # not up yet; the parent keeps it alive meanwhile
                    failing.append(dict(worker.describe(), reason=worker.why_down()))
                elif code != 200:
                    failing.append(dict(worker.describe(), **body))
            if failing:
                return False, {"status": "unavailable", "workers": failing}
            return True, {"status": "ok", "workers": len(self.workers)}

        async def readyz() -> tuple[bool, dict[str, Any]]:
            not_ready = [
                dict(worker.describe(), **body)
                if code is not None
                else dict(worker.describe(), reason=worker.why_down())
                for worker, code, body in await ask("/readyz")
                if code != 200
            ]
            if not_ready:
                return False, {"status": "unavailable", "workers": not_ready}
            return True, {"status": "ok", "workers": len(self.workers)}

        async def status() -> tuple[bool, dict[str, Any]]:
            workers = []
            for worker, code, body in await ask("/status.json"):
                entry = dict(worker.describe(), status="unavailable")
                if code is None:
                    entry["reason"] = worker.why_down()
                else:
                    entry.update(body)
                workers.append(entry)
            ok = all(entry["status"] == "ok" for entry in workers)
            return ok, {"status": "ok" if ok else "unavailable", "workers": workers}

        return {"/livez": livez, "/readyz": readyz, "/status.json": status}


def _read_port(fd: int) -> int | None:
    """The port a worker wrote to ``fd`` (``None`` if it exited first); closes ``fd``."""
    with os.fdopen(fd, "rb") as pipe:
        line = pipe.readline().strip()
    return int(line) if line.isdigit() else None


async def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """A worker's answer on ``path``: ``(status, JSON body)``; 503 when it does not
    answer within :data:`ASK_TIMEOUT` seconds."""
    writer = None
    try:
        async with asyncio.timeout(ASK_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            reply = await reader.read()  # the worker's server closes after its answer
        head, _, body = reply.partition(b"\r\n\r\n")
        code = int(head.split(b" ", 2)[1])
        return code, json.loads(body)
    except (OSError, TimeoutError, ValueError, IndexError) as error:
        reason = f"worker did not answer: {type(error).__name__}: {error}".rstrip(": ")
        return 503, {"status": "unavailable", "reason": reason}
    finally:
        if writer is not None:
            writer.close()


def worker_command(argv: Sequence[str]) -> list[str]:
    """The command line of a worker: ``argv`` of ``ackgate run`` without the options
    the parent handles itself (``--workers``, ``--health-*``, ``--metrics-port``)."""
    command = [sys.executable, "-m", "ackgate", "run"]
    skip = {"--workers", "--health-port", "--health-host", "--metrics-port"}
    args = iter(argv)
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in skip:
            if "=" not in arg:
                next(args, None)
            continue
        command.append(arg)
    return command


def report_health_port(port: int) -> None:
    """Caller: a worker's ``ackgate run``, once its health server listens."""
    fd = os.environ.pop(REPORT_FD_ENV, None)
    if fd is not None:
        with os.fdopen(int(fd), "w") as pipe:
            pipe.write(f"{port}\n")


def watch_parent(stop: Callable[[], None]) -> Callable[[], None] | None:
    """Caller: a worker's ``ackgate run``, on its event loop. Calls ``stop()`` once the
    parent is gone (it is no longer this process's parent), looking once a second
    from the loop, without a thread or a blocking wait. Returns what cancels the
    watch (call it when the run ends), or ``None`` outside a worker."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        return None
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def look() -> None:
        nonlocal timer
        if os.getppid() != int(parent):
            stop()
            return
        timer = loop.call_later(1.0, look)

    def cancel() -> None:
        if timer is not None:
            timer.cancel()

    look()
    return cancel
