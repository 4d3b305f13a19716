"""Moved to :mod:`ackgate.testing._local`; kept so existing imports keep working."""

from ackgate.testing._local import (
    TEST_JAVA_OPTS,
    BrokerError,
    LocalKafkaBroker,
    kafka_version,
)
from ackgate.testing._local import kafka_libs as broker_libs
from ackgate.testing._local import kafka_metadata_ok as metadata_ok

__all__ = [
    "TEST_JAVA_OPTS",
    "BrokerError",
    "LocalKafkaBroker",
    "broker_libs",
    "kafka_version",
    "metadata_ok",
]
