"""Every adapter without its client library: an ImportError that says what to install.

Each case imports the adapter afresh while its client library is blocked
(``sys.modules[name] = None`` makes ``import name`` raise; submodules other tests
already imported are blocked too), builds a producer (which needs no client) and pulls
the first event, which is where the client is first used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest


class MissingClient(NamedTuple):
    adapter: str
    blocked: str
    build: Callable[[Any], Any]
    message: str


CASES = [
    MissingClient(
        "ackgate_kafka",
        "aiokafka",
        lambda module: module.KafkaStreamProducer(
            "orders", bootstrap_servers="127.0.0.1:1", group_id="g"
        ),
        "ackgate-kafka needs aiokafka: pip install 'ackgate[kafka]'",
    ),
    MissingClient(
        "ackgate_sqs",
        "aiobotocore",
        lambda module: module.SqsStreamProducer(
            "http://127.0.0.1:1/000000000000/orders",
            region_name="us-east-1",
            endpoint_url="http://127.0.0.1:1",
        ),
        "ackgate-sqs needs aiobotocore: pip install 'ackgate[sqs]'",
    ),
    MissingClient(
        "ackgate_pubsub",
        "google.pubsub_v1",
        lambda module: module.PubSubStreamProducer("projects/p/subscriptions/orders"),
        "ackgate-pubsub needs google-cloud-pubsub: pip install 'ackgate[pubsub]'",
    ),
    MissingClient(
        "ackgate_servicebus",
        "azure.servicebus",
        lambda module: module.ServiceBusStreamProducer(
            connection_string="Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=v",
            queue_name="orders",
        ),
        "ackgate-servicebus needs azure-servicebus: pip install 'ackgate[servicebus]'",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.adapter for case in CASES])
async def test_a_missing_client_names_what_to_install(
    case: MissingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = [name for name in sys.modules if name.startswith(f"{case.blocked}.")]
    for name in [case.blocked, *loaded]:
        monkeypatch.setitem(sys.modules, name, None)
    # The adapter and every one of its modules, so that none was imported with the client.
    parts = [name for name in sys.modules if name.startswith(f"{case.adapter}.")]
    for name in [case.adapter, *parts]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    adapter = importlib.import_module(case.adapter)
    producer = case.build(adapter)
    try:
        with pytest.raises(ImportError) as raised:
            await anext(producer.open_stream())
    finally:
        await producer.aclose()
    assert str(raised.value) == case.message
    assert isinstance(raised.value.__cause__, ImportError)
