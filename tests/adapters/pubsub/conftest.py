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
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ackgate_test_support.local_server import ServerDidNotStart, answers, free_port, local_server

from .pubsub_support import PubSubAdmin

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
_START_TIMEOUT = 60.0


def _ready(host: str) -> bool:
    # The emulator answers a plain HTTP/1.1 GET / with "Ok" once it serves.
    return answers(f"http://{host}/", b"Ok")


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
    host = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as env:
        argv = [str(EMULATOR), "--host=127.0.0.1", f"--port={host.rsplit(':', 1)[1]}"]
        log = Path(tmp, "emulator.log")
        try:
            with local_server(
                argv, ready=lambda: _ready(host), log=log, start_timeout=_START_TIMEOUT, cwd=tmp
            ):
                env.setenv("PUBSUB_EMULATOR_HOST", host)
                yield host
        except ServerDidNotStart as exc:
            pytest.fail(f"the Pub/Sub emulator did not start on {host}: {exc}")


@pytest.fixture
async def pubsub(pubsub_emulator: str) -> AsyncIterator[PubSubAdmin]:
    admin = PubSubAdmin(pubsub_emulator)
    try:
        yield admin
    finally:
        await admin.aclose()
