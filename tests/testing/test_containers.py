"""Container lifecycle: labels, cleanup of killed runs, and Service Bus without its image.

Needs a Docker API (marker ``containers``, selected in CI's container stage).
"""

from __future__ import annotations

import signal

import pytest

from ackgate.testing import _containers
from ackgate.testing._local import http_status
from ackgate.testing.brokers import NoBroker, broker

from .brokers_cli import owned_containers, start_up

pytestmark = pytest.mark.containers


def test_a_killed_run_leaves_no_containers_after_the_next_run() -> None:
    process, exported = start_up("sqs", "--container")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    left = owned_containers(process.pid)
    assert len(left) == 1, "SIGKILL gives no chance to clean up: the container stays"
    assert set(left) <= set(_containers.remove_leftovers())
    assert owned_containers(process.pid) == []
    assert http_status(f"{exported['ACKGATE_SQS_ENDPOINT']}/") is None


def test_cleanup_keeps_the_containers_of_live_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKGATE_BROKERS", "container")
    with _containers.sqs() as endpoint:
        assert _containers.started_any()
        _containers.remove_leftovers()
        assert http_status(f"{endpoint}/") is not None
        mine = {
            c.name
            for c in _containers.docker_client().containers.list(
                filters={"label": f"{_containers.SESSION_LABEL}={_containers.SESSION}"}
            )
        }
        assert mine, "a running container carries this session's label"
    assert http_status(f"{endpoint}/") is None


def test_owner_labels_name_live_and_dead_processes() -> None:
    assert _containers.owner_alive(_containers.labels()[_containers.OWNER_LABEL])
    host = _containers.socket.gethostname()
    assert not _containers.owner_alive(f"{host}:999999999:1")
    assert _containers.owner_alive("another-host:1:1"), "another host's runs are never touched"


def test_servicebus_without_its_image_fails_with_the_image_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACKGATE_SERVICEBUS_CONNECTION", raising=False)
    monkeypatch.setenv("ACKGATE_SERVICEBUS_IMAGE", "ackgate/absent-servicebus:none")
    monkeypatch.setenv("ACKGATE_SERVICEBUS_SQL_IMAGE", "ackgate/absent-mssql:none")
    with pytest.raises(NoBroker) as failure, broker("servicebus", "container"):
        pass
    attempts = dict(failure.value.attempts)
    assert (
        "ackgate/absent-mssql:none did not start"
        in attempts["container ackgate/absent-servicebus:none"]
    )
    assert attempts["local"] == "not tried: ACKGATE_BROKERS=container"
