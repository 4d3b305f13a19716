"""Running a broker or emulator as a local process, for the tests and the benchmarks.

One way to do it everywhere: a free 127.0.0.1 port, the output in a log file, a
readiness probe polled until a deadline, and on exit terminate, then kill.
(Kafka has its own :mod:`ackgate_test_support.kafka_broker`: it also fetches and formats.)
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


class ServerDidNotStart(RuntimeError):
    """The process exited or did not answer in time; the message ends with its log tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str, body: bytes | None = None) -> bool:
    """Whether ``url`` answers an HTTP GET (with ``body``, stripped, if given)."""
    try:
        with _DIRECT.open(url, timeout=1) as response:
            return body is None or bool(response.read().strip() == body)
    except (OSError, urllib.error.URLError):
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def local_server(
    argv: Sequence[str],
    *,
    ready: Callable[[], bool],
    log: Path,
    start_timeout: float,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv``, wait until ``ready()``, yield the process, stop it on exit.

    Raises :class:`ServerDidNotStart` if it exits first or ``start_timeout`` passes.
    """
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        deadline = time.monotonic() + start_timeout
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise ServerDidNotStart(f"{argv[0]} did not start:\n{log_tail(log)}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
