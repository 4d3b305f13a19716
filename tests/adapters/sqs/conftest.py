"""A real SQS endpoint for the adapter tests.

moto's server (``python -m moto.server``) runs as a separate process on a free
127.0.0.1 port for the whole session, unless ``ACKGATE_SQS_ENDPOINT`` names a
running endpoint (LocalStack, ElasticMQ, ...). Dummy credentials are set for the
session. If the server cannot start, the session fails with its log tail.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiobotocore.session import get_session

from ackgate_test_support.local_server import ServerDidNotStart, answers, free_port, local_server

from .sqs_support import REGION, SqsAdmin

_START_TIMEOUT = 30.0


def _ready(endpoint: str) -> bool:
    return answers(f"{endpoint}/moto-api/")


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
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        with tempfile.TemporaryDirectory() as tmp:
            try:
                with local_server(
                    argv,
                    ready=lambda: _ready(endpoint),
                    log=Path(tmp, "moto.log"),
                    start_timeout=_START_TIMEOUT,
                ):
                    yield endpoint
            except ServerDidNotStart as exc:
                pytest.fail(f"moto server did not start on {endpoint}: {exc}")


@pytest.fixture
async def sqs(sqs_endpoint: str) -> AsyncIterator[SqsAdmin]:
    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=sqs_endpoint
    ) as client:
        yield SqsAdmin(client, sqs_endpoint)
