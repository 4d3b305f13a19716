"""ackgate.testing.brokers without a broker: what a fixture that gets none reports, and
that the package stays free of test-only imports until they are used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ackgate.testing._local import free_port
from ackgate.testing.brokers import NoBroker, broker


def test_importing_the_testing_package_imports_no_test_tooling() -> None:
    code = (
        "import sys, ackgate.testing, ackgate.testing.brokers, ackgate.testing.conformance,"
        " ackgate.testing.resources\n"
        "loaded = {'pytest', 'testcontainers', 'docker', 'aiokafka', 'moto'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_given_address_that_does_not_answer_fails_without_falling_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("ACKGATE_SQS_ENDPOINT", endpoint)
    with pytest.raises(NoBroker) as failure, broker("sqs", "auto"):
        pass
    assert failure.value.attempts == [(f"ACKGATE_SQS_ENDPOINT={endpoint}", "does not answer HTTP")]


def test_no_broker_lists_every_path_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACKGATE_SERVICEBUS_CONNECTION", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(NoBroker) as failure, broker("servicebus", "auto"):
        pass
    paths = [path for path, _ in failure.value.attempts]
    assert paths == ["ACKGATE_SERVICEBUS_CONNECTION", "container", "local"]
    message = str(failure.value)
    assert "no Docker API" in message
    assert "no local Service Bus server exists" in message


def test_a_forced_path_says_the_other_was_not_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACKGATE_SERVICEBUS_CONNECTION", raising=False)
    with pytest.raises(NoBroker) as failure, broker("servicebus", "local"):
        pass
    assert ("container", "not tried: ACKGATE_BROKERS=local") in failure.value.attempts


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKGATE_BROKERS", "cloud")
    with pytest.raises(ValueError, match="ACKGATE_BROKERS"), broker("kafka"):
        pass
