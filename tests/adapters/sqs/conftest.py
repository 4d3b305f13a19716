"""A real SQS endpoint for the adapter tests.

moto's server (``python -m moto.server``) runs as a separate process on a free
127.0.0.1 port for the whole session, unless ``ACKGATE_SQS_ENDPOINT`` names a
running endpoint (LocalStack, ElasticMQ, ...). Dummy credentials are set for the
session. If the server cannot start, the session fails with its log tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiobotocore.session import get_session
from sqs_support import REGION, SqsAdmin

_START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
            return True
    except (OSError, urllib.error.URLError):
        return False


def _tail(path: Path) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-30:])


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", REGION)
        env.delenv("AWS_PROFILE", raising=False)
        given = os.environ.get("ACKGATE_SQS_ENDPOINT")
        if given:
            yield given
            return
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp, "moto.log")
            with log.open("wb") as out:
                server = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                deadline = time.monotonic() + _START_TIMEOUT
                while not _ready(endpoint):
                    if server.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"moto server did not start on {endpoint}:\n{_tail(log)}")
                    time.sleep(0.1)
                yield endpoint
            finally:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


@pytest.fixture
async def sqs(sqs_endpoint: str) -> AsyncIterator[SqsAdmin]:
    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=sqs_endpoint
    ) as client:
        yield SqsAdmin(client, sqs_endpoint)
