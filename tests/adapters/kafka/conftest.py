"""A genuine Apache Kafka broker (KRaft, single node) for the Kafka adapter tests.

The session fixture ``kafka_bootstrap`` uses ``ACKGATE_KAFKA_BOOTSTRAP`` when it names a
running broker. Otherwise it starts one with :mod:`ackgate_test_support.kafka_broker`: the official
``org.apache.kafka:kafka_2.13`` jars fetched by Maven into a cache outside the repo (the
first run takes a few seconds more), storage formatted in a temporary directory, the
broker on free 127.0.0.1 ports, awaited until it answers a metadata request. If that
fails, every Kafka test fails with the broker's log tail; none is skipped.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

from ackgate_test_support.kafka_broker import (
    BrokerError,
    LocalKafkaBroker,
    broker_libs,
    kafka_version,
    metadata_ok,
)

from .kafka_testlib import KafkaTestCluster


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a running Kafka broker for the whole session."""
    external = os.environ.get("ACKGATE_KAFKA_BOOTSTRAP")
    if external:
        if not asyncio.run(metadata_ok(external)):
            pytest.fail(f"ACKGATE_KAFKA_BOOTSTRAP={external!r} does not answer metadata requests")
        yield external
        return
    started = time.monotonic()
    try:
        broker_libs()
        fetched = time.monotonic()
        broker = LocalKafkaBroker(tmp_path_factory.mktemp("kafka"))
        broker.start()
    except BrokerError as exc:
        pytest.fail(str(exc))
    print(
        f"\nKafka broker {kafka_version()} ready at {broker.bootstrap}: jars "
        f"{fetched - started:.1f}s, start {time.monotonic() - fetched:.1f}s"
    )
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaTestCluster:
    return KafkaTestCluster(kafka_bootstrap)
