"""``python -m ackgate.testing.brokers up``: start, print the address, stop on Ctrl-C.

Runs on the path ``ACKGATE_BROKERS`` picks (a local process by default, a container in
CI's container stage).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from ackgate.testing._local import http_status, kafka_metadata_ok
from ackgate.testing.brokers import brokers_mode

from .brokers_cli import owned_containers, start_up


def _answers(kind: str, exported: dict[str, str]) -> bool:
    if kind == "kafka":
        return asyncio.run(kafka_metadata_ok(exported["ACKGATE_KAFKA_BOOTSTRAP"]))
    return http_status(f"{exported['ACKGATE_SQS_ENDPOINT']}/") is not None


@pytest.mark.parametrize(
    ("kind", "stop"),
    [("kafka", signal.SIGINT), ("sqs", signal.SIGINT), ("sqs", signal.SIGTERM)],
    ids=["kafka-SIGINT", "sqs-SIGINT", "sqs-SIGTERM"],
)
def test_up_serves_until_interrupted_and_leaves_nothing(kind: str, stop: signal.Signals) -> None:
    process, exported = start_up(kind)
    try:
        assert _answers(kind, exported)
        process.send_signal(stop)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert not _answers(kind, exported)
    if brokers_mode() == "container":
        assert owned_containers(process.pid) == []
