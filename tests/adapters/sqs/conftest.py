"""A real SQS endpoint for the adapter tests.

``sqs_endpoint`` is the session's endpoint from the ``ackgate_sqs`` fixture of the
``ackgate.testing`` pytest plugin: ``ACKGATE_SQS_ENDPOINT`` when given, else a container
(ElasticMQ by default, ``ACKGATE_SQS_IMAGE``), else moto's server as a local process.
The plugin exports the region and dummy credentials for the session. If no endpoint
can be had, the tests fail with what was tried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiobotocore.session import get_session

from ackgate.testing.brokers import SqsBroker

from .sqs_support import REGION, SqsAdmin


@pytest.fixture(scope="session")
def sqs_endpoint(ackgate_sqs: SqsBroker) -> str:
    return ackgate_sqs.endpoint_url


@pytest.fixture
async def sqs(sqs_endpoint: str) -> AsyncIterator[SqsAdmin]:
    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=sqs_endpoint
    ) as client:
        yield SqsAdmin(client, sqs_endpoint)
