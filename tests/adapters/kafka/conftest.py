"""A genuine Apache Kafka broker (KRaft, single node) for the Kafka adapter tests.

``kafka_bootstrap`` is the address of the session's broker from the ``ackgate_kafka``
fixture of the ``ackgate.testing`` pytest plugin: ``ACKGATE_KAFKA_BOOTSTRAP`` when it
names a running broker, else a container (``ACKGATE_KAFKA_IMAGE``), else the official
jars fetched by Maven and run as a local process (``ACKGATE_BROKERS`` picks the path).
If none works, every Kafka test fails with what was tried; none is skipped.
"""

from __future__ import annotations

import pytest

from ackgate.testing.brokers import KafkaBroker

from .kafka_testlib import KafkaTestCluster


@pytest.fixture(scope="session")
def kafka_bootstrap(ackgate_kafka: KafkaBroker) -> str:
    """``host:port`` of a running Kafka broker for the whole session."""
    return ackgate_kafka.bootstrap


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaTestCluster:
    return KafkaTestCluster(kafka_bootstrap)
