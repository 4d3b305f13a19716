"""The pytest plugin (entry point ``pytest11: ackgate``): real brokers as fixtures.

``pip install 'ackgate[testing]'`` registers it; nothing starts until a test asks for
a broker. Session-scoped, one broker per session (see :mod:`ackgate.testing.brokers`
for where it comes from and ``ACKGATE_BROKERS``):

* ``ackgate_kafka`` → :class:`~ackgate.testing.brokers.KafkaBroker` (``.bootstrap``)
* ``ackgate_sqs`` → :class:`~ackgate.testing.brokers.SqsBroker` (``.endpoint_url``,
  region and dummy credentials, also exported as ``AWS_*`` for the session)
* ``ackgate_pubsub`` → :class:`~ackgate.testing.brokers.PubSubBroker`
  (``.emulator_host``, also exported as ``PUBSUB_EMULATOR_HOST`` for the session)
* ``ackgate_servicebus`` → :class:`~ackgate.testing.brokers.ServiceBusBroker`
  (``.connection_string``; a container only)

Function-scoped, fresh resources with unique names on those brokers
(:mod:`ackgate.testing.resources`): ``ackgate_kafka_fresh``, ``ackgate_sqs_fresh``,
``ackgate_pubsub_fresh``.

A fixture that gets no broker fails the tests that use it with every path it tried
and why each failed; none is skipped. Containers started in the session are removed
at its end; those of killed runs are removed when the next run starts its first one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from ackgate.testing.brokers import (
    Broker,
    KafkaBroker,
    Kind,
    NoBroker,
    PubSubBroker,
    ServiceBusBroker,
    SqsBroker,
    broker,
)
from ackgate.testing.resources import KafkaFresh, PubSubFresh, SqsFresh


def _session_broker(kind: Kind, export: bool) -> Iterator[Broker]:
    try:
        running = broker(kind)
        found = running.__enter__()
    except NoBroker as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        with pytest.MonkeyPatch.context() as env:
            if export:
                for name, value in found.env().items():
                    env.setenv(name, value)
                env.delenv("AWS_PROFILE", raising=False)
            yield found
    finally:
        running.__exit__(None, None, None)


@pytest.fixture(scope="session")
def ackgate_kafka() -> Iterator[KafkaBroker]:
    """A Kafka broker for the session."""
    for found in _session_broker("kafka", export=False):
        assert isinstance(found, KafkaBroker)
        yield found


@pytest.fixture(scope="session")
def ackgate_sqs() -> Iterator[SqsBroker]:
    """An SQS endpoint for the session; its region and credentials are exported."""
    for found in _session_broker("sqs", export=True):
        assert isinstance(found, SqsBroker)
        yield found


@pytest.fixture(scope="session")
def ackgate_pubsub() -> Iterator[PubSubBroker]:
    """A Pub/Sub emulator for the session, exported as ``PUBSUB_EMULATOR_HOST``."""
    for found in _session_broker("pubsub", export=True):
        assert isinstance(found, PubSubBroker)
        yield found


@pytest.fixture(scope="session")
def ackgate_servicebus() -> Iterator[ServiceBusBroker]:
    """A Service Bus emulator (container only) for the session."""
    for found in _session_broker("servicebus", export=False):
        assert isinstance(found, ServiceBusBroker)
        yield found


@pytest.fixture
def ackgate_kafka_fresh(ackgate_kafka: KafkaBroker) -> KafkaFresh:
    """Creates topics and group ids no other test uses."""
    return KafkaFresh(ackgate_kafka)


@pytest.fixture
def ackgate_sqs_fresh(ackgate_sqs: SqsBroker) -> SqsFresh:
    """Creates queues no other test uses."""
    return SqsFresh(ackgate_sqs)


@pytest.fixture
def ackgate_pubsub_fresh(ackgate_pubsub: PubSubBroker) -> PubSubFresh:
    """Creates topics and subscriptions no other test uses."""
    return PubSubFresh(ackgate_pubsub)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove whatever container this session left (a fixture that was never torn down)."""
    containers = sys.modules.get("ackgate.testing._containers")
    if containers is not None and containers.started_any():
        containers.remove_session()
