"""Google's Pub/Sub emulator for the adapter tests.

The emulator script from the Cloud SDK runs as a separate process on a free
127.0.0.1 port for the whole session (never through ``gcloud``, which writes into
the home directory), unless ``PUBSUB_EMULATOR_HOST`` already names a running one.
``PUBSUB_EMULATOR_HOST`` is set for the session so the adapter finds it. If the
emulator is missing or does not start, the session fails with the path or the
log tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pubsub_support import PubSubAdmin

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
_START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def _ready(host: str) -> bool:
    # The emulator answers a plain HTTP/1.1 GET / with "Ok" once it serves.
    try:
        with _DIRECT.open(f"http://{host}/", timeout=1) as response:
            return bool(response.read().strip() == b"Ok")
    except (OSError, urllib.error.URLError):
        return False


def _tail(path: Path) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-30:])


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[str]:
    """``host:port`` of a running emulator, also exported as ``PUBSUB_EMULATOR_HOST``."""
    given = os.environ.get("PUBSUB_EMULATOR_HOST")
    if given:
        if not _ready(given):
            pytest.fail(f"PUBSUB_EMULATOR_HOST={given} does not answer")
        yield given
        return
    if not EMULATOR.exists():
        pytest.fail(f"the Pub/Sub emulator is not installed at {EMULATOR}")
    host = f"127.0.0.1:{_free_port()}"
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as env:
        log = Path(tmp, "emulator.log")
        with log.open("wb") as out:
            emulator = subprocess.Popen(
                [str(EMULATOR), "--host=127.0.0.1", f"--port={host.rsplit(':', 1)[1]}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tmp,
            )
        try:
            deadline = time.monotonic() + _START_TIMEOUT
            while not _ready(host):
                if emulator.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the Pub/Sub emulator did not start on {host}:\n{_tail(log)}")
                time.sleep(0.2)
            env.setenv("PUBSUB_EMULATOR_HOST", host)
            yield host
        finally:
            emulator.terminate()
            try:
                emulator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                emulator.kill()
                emulator.wait()


@pytest.fixture
async def pubsub(pubsub_emulator: str) -> AsyncIterator[PubSubAdmin]:
    admin = PubSubAdmin(pubsub_emulator)
    try:
        yield admin
    finally:
        await admin.aclose()
