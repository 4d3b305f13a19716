"""Every adapter's producer: its ``repr`` masks secrets, and an option its client does
not take is a ``TypeError`` naming it and the closest valid name, when it is built
(docs/production.md#security). No broker needed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import ackgate
from ackgate_kafka import KafkaStreamProducer
from ackgate_pubsub import PubSubStreamProducer
from ackgate_servicebus import ServiceBusStreamProducer
from ackgate_sqs import SqsStreamProducer

SECRET = "s3cr3t-Pa55"


class Credentials:
    """A credentials object whose own ``repr`` would print its secret."""

    def __repr__(self) -> str:
        return f"Credentials(token={SECRET!r})"


PRODUCERS: dict[str, Callable[[], Any]] = {
    "kafka": lambda: KafkaStreamProducer(
        "orders",
        bootstrap_servers="broker:9093",
        group_id="g",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password=SECRET,
        sasl_oauth_token_provider=Credentials(),
        dlq_topic="orders.dlq",
        dlq_producer_options={"sasl_plain_password": SECRET, "max_request_size": 10_485_760},
    ),
    "sqs": lambda: SqsStreamProducer(
        "https://sqs.eu-west-1.amazonaws.com/1/orders",
        region_name="eu-west-1",
        aws_access_key_id="AKIAEXAMPLE",
        aws_secret_access_key=SECRET,
        aws_session_token=SECRET,
    ),
    "pubsub": lambda: PubSubStreamProducer(
        "projects/p/subscriptions/orders",
        client_options={"api_endpoint": "pubsub.googleapis.com", "api_key": SECRET},
        credentials=Credentials(),
    ),
    "servicebus": lambda: ServiceBusStreamProducer(
        connection_string=(
            f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={SECRET}"
        ),
        queue_name="orders",
    ),
}


@pytest.mark.parametrize("adapter", sorted(PRODUCERS))
def test_a_producers_repr_masks_its_secrets(adapter: str) -> None:
    producer = PRODUCERS[adapter]()
    shown = repr(producer)
    assert SECRET not in shown, shown
    assert "orders" in shown  # still says what it reads


@pytest.mark.parametrize(
    ("build", "misspelt", "meant"),
    [
        (
            lambda **o: KafkaStreamProducer("t", bootstrap_servers="b:1", group_id="g", **o),
            "sasl_plain_pasword",
            "sasl_plain_password",
        ),
        (
            lambda **o: KafkaStreamProducer(
                "t", bootstrap_servers="b:1", group_id="g", dlq_topic="d", dlq_producer_options=o
            ),
            "max_requst_size",
            "max_request_size",
        ),
        (
            lambda **o: SqsStreamProducer("http://h/1/q", region_name="us-east-1", **o),
            "aws_secret_acess_key",
            "aws_secret_access_key",
        ),
        (
            lambda **o: PubSubStreamProducer("projects/p/subscriptions/s", client_options=o),
            "api_endpont",
            "api_endpoint",
        ),
    ],
    ids=["kafka", "kafka-dlq", "sqs", "pubsub"],
)
def test_a_misspelt_client_option_is_refused_when_the_producer_is_built(
    build: Callable[..., Any], misspelt: str, meant: str
) -> None:
    with pytest.raises(TypeError, match=f"'{misspelt}' \\(did you mean '{meant}'\\?\\)"):
        build(**{misspelt: "x"})


def test_check_options_and_masked_options_for_adapter_authors() -> None:
    def client(*, host: str, password: str = "") -> None: ...

    ackgate.check_options(["host", "password"], client, what="client")
    with pytest.raises(
        TypeError, match="unknown client options: 'hots' \\(did you mean 'host'\\?\\), 'zzz'"
    ):
        ackgate.check_options(["hots", "zzz"], client, what="client")
    ackgate.check_options(["anything"], lambda **kwargs: None, what="client")
    assert ackgate.masked_options({"host": "h", "password": SECRET, "token": None}) == {
        "host": "h",
        "password": "***",
        "token": None,
    }
