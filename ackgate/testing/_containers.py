"""Brokers in containers, through testcontainers (imported only when a container is wanted).

Every container carries the labels ``ackgate.testing=1``,
``ackgate.testing.session=<SESSION>`` and ``ackgate.testing.owner=<host>:<pid>:<start>``
(the process that started it). Ryuk, testcontainers' reaper, is an image on Docker Hub
and may be unreachable, so ackgate cleans up itself: a container is removed when its
context exits, every container of this session at the end of a pytest session, and
:func:`remove_leftovers` removes the containers of runs whose owner process is gone
(a killed run) at the start of the next one. Containers of a live run, on this host
or another one, are never touched.

Image names come from environment variables (:data:`IMAGES`) so a machine without a
registry can point them at images built by ``docker/build.sh``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import importlib
import json
import os
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ackgate.testing._local import (
    ServerDidNotStart,
    free_port,
    http_status,
    pubsub_emulator_ready,
    wait_kafka,
)

LABEL = "ackgate.testing"
SESSION_LABEL = "ackgate.testing.session"
OWNER_LABEL = "ackgate.testing.owner"
SESSION = uuid.uuid4().hex[:12]
"""This process's session id, on every container it starts."""

IMAGES: dict[str, tuple[str, str]] = {
    "kafka": ("ACKGATE_KAFKA_IMAGE", "apache/kafka:4.1.1"),
    "sqs": ("ACKGATE_SQS_IMAGE", "softwaremill/elasticmq-native:1.6.11"),
    "pubsub": ("ACKGATE_PUBSUB_IMAGE", "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"),
    "servicebus": (
        "ACKGATE_SERVICEBUS_IMAGE",
        "mcr.microsoft.com/azure-messaging/servicebus-emulator:latest",
    ),
    "servicebus-sql": (
        "ACKGATE_SERVICEBUS_SQL_IMAGE",
        "mcr.microsoft.com/mssql/server:2022-latest",
    ),
}
START_TIMEOUT = 120.0


def image(kind: str) -> str:
    variable, default = IMAGES[kind]
    return os.environ.get(variable) or default


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot), or ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid()) or '?'}"


def labels() -> dict[str, str]:
    return {LABEL: "1", SESSION_LABEL: SESSION, OWNER_LABEL: _owner()}


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label may still run. Another host's owner
    cannot be checked from here, so it counts as alive."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    return _process_start(int(pid)) == start


def docker_client() -> Any:
    """A docker SDK client that answered a ping; raises with the reason otherwise."""
    docker: Any = importlib.import_module("docker")  # testcontainers' dependency
    # Without a Docker engine the SDK leaves its failed connection's socket to the
    # garbage collector: a ResourceWarning in the user's session (an error under
    # ``filterwarnings = error``). The exception is rebuilt so nothing refers to that
    # socket any more, and it is collected here with the warning silenced.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=30)
            client.ping()
            return client
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        gc.collect()
    raise NoDockerApi(failure)


class NoDockerApi(RuntimeError):
    """No Docker API answered; the message is the SDK's error."""


def remove_leftovers(client: Any | None = None) -> list[str]:
    """Remove every ackgate container whose owner process is gone; return their names."""
    client = client or docker_client()
    removed = []
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        if not owner_alive(container.labels.get(OWNER_LABEL, "")):
            container.remove(force=True, v=True)
            removed.append(container.name)
    return removed


def remove_session(session: str = SESSION, client: Any | None = None) -> list[str]:
    """Remove every container (and network) of ``session``; return the container names."""
    client = client or docker_client()
    selector = {"label": f"{SESSION_LABEL}={session}"}
    removed = []
    for container in client.containers.list(all=True, filters=selector):
        container.remove(force=True, v=True)
        removed.append(container.name)
    for network in client.networks.list(filters=selector):
        network.remove()
    return removed


def _logs(container: Any) -> str:
    try:
        stdout, stderr = container.get_logs()
    except Exception as exc:
        return f"(no logs: {exc!r})"
    return str((stdout + stderr).decode(errors="replace")[-3000:])


@contextmanager
def _running(container: Any, ready: Callable[[], bool], timeout: float = START_TIMEOUT) -> Any:
    """Start ``container``, poll ``ready()`` until it holds, yield, remove the container."""
    name = container.image
    try:
        container.start()
    except Exception as exc:
        container.stop()
        raise ServerDidNotStart(f"{name} did not start: {type(exc).__name__}: {exc}") from None
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            container.reload()
            if container.status not in ("created", "running"):
                raise ServerDidNotStart(f"{name} exited:\n{_logs(container)}")
            if time.monotonic() > deadline:
                raise ServerDidNotStart(
                    f"{name} not ready after {timeout:.0f}s:\n{_logs(container)}"
                )
            time.sleep(0.2)
        yield container
    finally:
        container.stop()


_started: list[str] = []


def started_any() -> bool:
    return bool(_started)


def _container(kind: str) -> Any:
    """A labelled container of ``kind``'s image. The first one of a process removes the
    leftovers of killed runs and arranges for this session's containers to be removed
    at exit."""
    from testcontainers.core.container import DockerContainer

    if not _started:
        remove_leftovers()
        atexit.register(_remove_session_quietly)
    _started.append(kind)
    return DockerContainer(image(kind)).with_kwargs(labels=labels())


def _remove_session_quietly() -> None:
    # If the daemon went first, the next run's remove_leftovers() cleans up.
    with contextlib.suppress(Exception):
        remove_session()


@contextmanager
def kafka() -> Iterator[str]:
    """A single-node KRaft broker advertised on a fixed free host port; yields the
    bootstrap address. Speaks both ``apache/kafka``'s variables and ``ackgate/kafka``'s
    ``KAFKA_ADVERTISED``."""
    port = free_port()
    advertised = f"127.0.0.1:{port}"
    container = (
        _container("kafka")
        .with_bind_ports(9092, port)
        .with_env("KAFKA_ADVERTISED", advertised)
        .with_envs(
            KAFKA_NODE_ID="1",
            KAFKA_PROCESS_ROLES="broker,controller",
            KAFKA_LISTENERS="PLAINTEXT://:9092,CONTROLLER://:9093",
            KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://{advertised}",
            KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
            KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            KAFKA_CONTROLLER_QUORUM_VOTERS="1@localhost:9093",
            KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
            KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS="4",
            KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
            KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
            KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS="1000",
        )
    )

    def ready() -> bool:
        try:
            wait_kafka(advertised, lambda: None, timeout=1.0)
        except ServerDidNotStart:
            return False
        return True

    with _running(container, ready):
        yield advertised


@contextmanager
def sqs() -> Iterator[str]:
    """An SQS-compatible server listening on 9324 (ElasticMQ by default); yields its URL."""
    container = _container("sqs").with_exposed_ports(9324)

    def ready() -> bool:
        return http_status(f"{endpoint()}/?Action=ListQueues") is not None

    def endpoint() -> str:
        return f"http://127.0.0.1:{container.get_exposed_port(9324)}"

    with _running(container, ready):
        yield endpoint()


@contextmanager
def pubsub() -> Iterator[str]:
    """The Pub/Sub emulator on 8085; yields ``host:port``. The command is the one the
    Cloud SDK image needs; ``ackgate/pubsub-emulator`` ignores it."""
    container = (
        _container("pubsub")
        .with_exposed_ports(8085)
        .with_command(
            ["gcloud", "beta", "emulators", "pubsub", "start", "--host-port=0.0.0.0:8085"]
        )
    )

    def host() -> str:
        return f"127.0.0.1:{container.get_exposed_port(8085)}"

    with _running(container, lambda: pubsub_emulator_ready(host())):
        yield host()


SERVICEBUS_SQL_PASSWORD = "Ackgate-Emulator-Only-1!"  # a throwaway container's, private network


#: The entities of the plugin's Service Bus emulator; a server given through
#: ``ACKGATE_SERVICEBUS_CONNECTION`` must declare the same to run the same tests.
SERVICEBUS_QUEUES = ["probe", *(f"queue-{n}" for n in range(8))]
SERVICEBUS_SESSION_QUEUES = ["session-0"]  # RequiresSession
SERVICEBUS_SHORT_LOCK_QUEUES = ["short-lock-0"]  # LockDuration PT5S: lock renewal
SERVICEBUS_TOPICS = {"topic-0": ["ackgate"]}  # topic: its subscriptions


def _servicebus_queue(name: str, *, lock: str = "PT30S", sessions: bool = False) -> dict[str, Any]:
    return {
        "Name": name,
        "Properties": {
            "DeadLetteringOnMessageExpiration": False,
            "DefaultMessageTimeToLive": "PT1H",
            "DuplicateDetectionHistoryTimeWindow": "PT20S",
            "ForwardDeadLetteredMessagesTo": "",
            "ForwardTo": "",
            "LockDuration": lock,
            "MaxDeliveryCount": 10,
            "RequiresDuplicateDetection": False,
            "RequiresSession": sessions,
        },
    }


def servicebus_config(
    queues: list[str],
    *,
    session_queues: list[str] | None = None,
    short_lock_queues: list[str] | None = None,
    topics: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """An emulator ``Config.json`` declaring these entities (the emulator creates no
    entity at run time)."""
    subscription = {
        "DeadLetteringOnMessageExpiration": False,
        "DefaultMessageTimeToLive": "PT1H",
        "LockDuration": "PT1M",
        "MaxDeliveryCount": 10,
        "ForwardDeadLetteredMessagesTo": "",
        "ForwardTo": "",
        "RequiresSession": False,
    }
    namespace = {
        "Name": "sbemulatorns",
        "Queues": [
            *(_servicebus_queue(name) for name in queues),
            *(_servicebus_queue(name, sessions=True) for name in session_queues or []),
            *(_servicebus_queue(name, lock="PT5S") for name in short_lock_queues or []),
        ],
        "Topics": [
            {
                "Name": topic,
                "Properties": {
                    "DefaultMessageTimeToLive": "PT1H",
                    "DuplicateDetectionHistoryTimeWindow": "PT20S",
                    "RequiresDuplicateDetection": False,
                },
                "Subscriptions": [{"Name": name, "Properties": subscription} for name in names],
            }
            for topic, names in (topics or {}).items()
        ],
    }
    return {"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "Console"}}}


@contextmanager
def servicebus(config: dict[str, Any] | None = None) -> Iterator[str]:
    """Microsoft's Service Bus emulator beside an MSSQL container on a private network;
    yields the connection string once a message goes round trip through ``probe``."""
    from testcontainers.core.network import Network

    config = config or servicebus_config(
        SERVICEBUS_QUEUES,
        session_queues=SERVICEBUS_SESSION_QUEUES,
        short_lock_queues=SERVICEBUS_SHORT_LOCK_QUEUES,
        topics=SERVICEBUS_TOPICS,
    )
    with ExitStack() as stack:
        network = stack.enter_context(Network(docker_network_kw={"labels": labels()}))
        sql = (
            _container("servicebus-sql")
            .with_env("ACCEPT_EULA", "Y")
            .with_env("MSSQL_SA_PASSWORD", SERVICEBUS_SQL_PASSWORD)
            .with_network(network)
            .with_network_aliases("sqlserver")
        )
        stack.enter_context(_running(sql, lambda: "ready for client" in _logs(sql)))
        emulator = (
            _container("servicebus")
            .with_env("ACCEPT_EULA", "Y")
            .with_env("SQL_SERVER", "sqlserver")
            .with_env("MSSQL_SA_PASSWORD", SERVICEBUS_SQL_PASSWORD)
            .with_network(network)
            .with_exposed_ports(5672)
            .with_copy_into_container(
                json.dumps(config).encode(), "/ServiceBus_Emulator/ConfigFiles/Config.json"
            )
        )

        def connection() -> str:
            port = emulator.get_exposed_port(5672)
            return (
                f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
                "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
            )

        stack.enter_context(_running(emulator, lambda: _servicebus_usable(connection()), 240))
        yield connection()


def _servicebus_usable(connection: str) -> bool:
    # "Successfully Up" is logged before the emulator has created its databases; a
    # message that goes round trip is the real readiness signal.
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus.aio import ServiceBusClient

    async def round_trip() -> bool:
        async with ServiceBusClient.from_connection_string(connection) as client:
            async with client.get_queue_sender("probe") as sender:
                await sender.send_messages(ServiceBusMessage("ping"))
            async with client.get_queue_receiver("probe", max_wait_time=5) as receiver:
                for message in await receiver.receive_messages(max_wait_time=5):
                    await receiver.complete_message(message)
                    return True
        return False

    try:
        return asyncio.run(round_trip())
    except Exception:
        return False
