"""Google's Pub/Sub emulator for the adapter tests.

``pubsub_emulator`` is the session's emulator from the ``ackgate_pubsub`` fixture of
the ``ackgate.testing`` pytest plugin: ``PUBSUB_EMULATOR_HOST`` when it names a running
one, else a container (``ACKGATE_PUBSUB_IMAGE``), else the Cloud SDK's emulator as a
local process. The plugin exports ``PUBSUB_EMULATOR_HOST`` for the session so the
adapter finds it. If none works, the tests fail with what was tried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ackgate.testing.brokers import PubSubBroker

from .pubsub_support import PubSubAdmin


@pytest.fixture(scope="session")
def pubsub_emulator(ackgate_pubsub: PubSubBroker) -> str:
    """``host:port`` of a running emulator, also exported as ``PUBSUB_EMULATOR_HOST``."""
    return ackgate_pubsub.emulator_host


@pytest.fixture
async def pubsub(pubsub_emulator: str) -> AsyncIterator[PubSubAdmin]:
    admin = PubSubAdmin(pubsub_emulator)
    try:
        yield admin
    finally:
        await admin.aclose()
