"""End to end against Microsoft's Service Bus emulator, started through testcontainers.

Selected only with ``-m servicebus_emulator`` (pyproject deselects it by default) and
only runnable where a Docker engine is reachable: without one the fixture fails with
the reason, it never skips. The emulator needs a SQL Server container beside it on a
private network and reads its entities from ``Config.json`` (copied in below).
Override the images with ``ACKGATE_SB_EMULATOR_IMAGE`` / ``ACKGATE_SB_SQL_IMAGE``.

Each test owns its entities, so the tests do not see each other's messages.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from ackgate import SharedStreamManager, Subscription
from ackgate_servicebus import (
    DEAD_LETTER_REASON,
    NEXT_AVAILABLE_SESSION,
    ServiceBusStreamProducer,
)

pytestmark = pytest.mark.servicebus_emulator

EMULATOR_IMAGE = os.environ.get(
    "ACKGATE_SB_EMULATOR_IMAGE", "mcr.microsoft.com/azure-messaging/servicebus-emulator:latest"
)
SQL_IMAGE = os.environ.get("ACKGATE_SB_SQL_IMAGE", "mcr.microsoft.com/mssql/server:2022-latest")
SQL_PASSWORD = "Ackgate-Emulator-Only-1!"  # a throwaway container's, on a private network
STARTUP_TIMEOUT = 240


def _queue(name: str, *, lock: str = "PT30S", sessions: bool = False) -> dict[str, Any]:
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


CONFIG = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [
                    _queue("probe"),
                    _queue("complete"),
                    _queue("dead-letter"),
                    _queue("abandon"),
                    _queue("renew", lock="PT5S"),
                    _queue("sessions", sessions=True),
                ],
                "Topics": [
                    {
                        "Name": "orders",
                        "Properties": {
                            "DefaultMessageTimeToLive": "PT1H",
                            "DuplicateDetectionHistoryTimeWindow": "PT20S",
                            "RequiresDuplicateDetection": False,
                        },
                        "Subscriptions": [
                            {
                                "Name": "ackgate",
                                "Properties": {
                                    "DeadLetteringOnMessageExpiration": False,
                                    "DefaultMessageTimeToLive": "PT1H",
                                    "LockDuration": "PT1M",
                                    "MaxDeliveryCount": 10,
                                    "ForwardDeadLetteredMessagesTo": "",
                                    "ForwardTo": "",
                                    "RequiresSession": False,
                                },
                            }
                        ],
                    }
                ],
            }
        ],
        "Logging": {"Type": "Console"},
    }
}


def _log_tail(container: DockerContainer) -> str:
    try:
        stdout, stderr = container.get_logs()
    except Exception as exc:
        return f"<no logs: {exc!r}>"
    return (stdout + stderr).decode(errors="replace")[-4000:]


async def _wait_until_usable(connection_string: str) -> None:
    # "Successfully Up" is logged before the emulator finishes creating its
    # databases; a message that goes round trip is the real readiness signal.
    async with asyncio.timeout(STARTUP_TIMEOUT):
        while True:
            try:
                await send(connection_string, "probe", ["ping"])
                async with (
                    ServiceBusClient.from_connection_string(connection_string) as client,
                    client.get_queue_receiver("probe", max_wait_time=5) as receiver,
                ):
                    for message in await receiver.receive_messages(max_wait_time=5):
                        await receiver.complete_message(message)
                        return
            except Exception:
                await asyncio.sleep(2)  # poll interval of a readiness probe


@pytest.fixture(scope="module")
def connection_string() -> Iterator[str]:
    with ExitStack() as stack:
        try:
            network = stack.enter_context(Network())
        except Exception as exc:
            pytest.fail(
                "the Service Bus emulator tests need a reachable Docker engine "
                f"(testcontainers said {type(exc).__name__}: {exc})",
                pytrace=False,
            )
        sql = (
            DockerContainer(SQL_IMAGE)
            .with_env("ACCEPT_EULA", "Y")
            .with_env("MSSQL_SA_PASSWORD", SQL_PASSWORD)
            .with_network(network)
            .with_network_aliases("sqlserver")
            .waiting_for(
                LogMessageWaitStrategy(
                    "SQL Server is now ready for client connections"
                ).with_startup_timeout(STARTUP_TIMEOUT)
            )
        )
        emulator = (
            DockerContainer(EMULATOR_IMAGE)
            .with_env("ACCEPT_EULA", "Y")
            .with_env("SQL_SERVER", "sqlserver")
            .with_env("MSSQL_SA_PASSWORD", SQL_PASSWORD)
            .with_network(network)
            .with_exposed_ports(5672)
            .with_copy_into_container(
                json.dumps(CONFIG).encode(), "/ServiceBus_Emulator/ConfigFiles/Config.json"
            )
            .waiting_for(
                LogMessageWaitStrategy("Emulator Service is Successfully Up!").with_startup_timeout(
                    STARTUP_TIMEOUT
                )
            )
        )
        for container in (sql, emulator):
            try:
                stack.enter_context(container)
            except Exception as exc:
                pytest.fail(
                    f"{container.image} did not start ({type(exc).__name__}: {exc}); "
                    f"log tail:\n{_log_tail(container)}",
                    pytrace=False,
                )
        host, port = emulator.get_container_host_ip(), emulator.get_exposed_port(5672)
        connection = (
            f"Endpoint=sb://{host}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )
        try:
            asyncio.run(_wait_until_usable(connection))
        except TimeoutError:
            pytest.fail(f"the emulator never delivered a message:\n{_log_tail(emulator)}")
        yield connection


async def send(
    connection_string: str, entity: str, bodies: list[str], session_id: str | None = None
) -> None:
    async with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_sender(entity) as sender,
    ):
        await sender.send_messages([ServiceBusMessage(b, session_id=session_id) for b in bodies])


async def peek(connection_string: str, entity: str, *, dead_letter: bool = False) -> list[Any]:
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead_letter else None
    async with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(entity, sub_queue=sub_queue) as receiver,
    ):
        return list(await receiver.peek_messages(max_message_count=50))


async def consume(sub: Subscription, count: int, crash_on: str | None = None) -> list[Any]:
    seen: list[Any] = []
    async with asyncio.timeout(60), sub:
        async for message in sub:
            seen.append(message)
            if str(message) == crash_on:
                raise RuntimeError("handler crashed")
            if len(seen) == count:
                break
    return seen


def producer(connection_string: str, **options: Any) -> Any:
    options.setdefault("max_wait_time", 1.0)
    return lambda: ServiceBusStreamProducer(connection_string=connection_string, **options)


async def test_acked_events_are_completed(connection_string: str) -> None:
    await send(connection_string, "complete", ["a", "b", "c"])
    make = producer(connection_string, queue_name="complete")
    async with SharedStreamManager() as manager:
        subs = [manager.subscribe("complete", name, producer=make) for name in ("x", "y")]
        seen = await asyncio.gather(*(consume(sub, 3) for sub in subs))
    assert [[str(m) for m in got] for got in seen] == [["a", "b", "c"]] * 2
    assert await peek(connection_string, "complete") == []


async def test_a_topic_subscription_is_read_and_completed(connection_string: str) -> None:
    await send(connection_string, "orders", ["o1"])
    make = producer(connection_string, topic_name="orders", subscription_name="ackgate")
    async with SharedStreamManager() as manager:
        seen = await consume(manager.subscribe("orders", "x", producer=make), 1)
    assert [str(m) for m in seen] == ["o1"]


async def test_a_rejected_event_is_dead_lettered(connection_string: str) -> None:
    await send(connection_string, "dead-letter", ["poison"])
    make = producer(connection_string, queue_name="dead-letter")
    async with SharedStreamManager() as manager:
        sub = manager.subscribe("dlq", "x", producer=make)
        async with asyncio.timeout(60), sub:
            async for _ in sub:
                sub.reject()
                break
    [dead] = await peek(connection_string, "dead-letter", dead_letter=True)
    assert (str(dead), dead.dead_letter_reason) == ("poison", DEAD_LETTER_REASON)
    assert dead.dead_letter_error_description == "rejected by 1 of 1 ackgate subscribers"
    assert await peek(connection_string, "dead-letter") == []


async def test_a_failed_event_is_abandoned_and_redelivered(connection_string: str) -> None:
    await send(connection_string, "abandon", ["m"])
    make = producer(connection_string, queue_name="abandon")
    async with SharedStreamManager() as manager:
        crashy = manager.subscribe("abandon", "crashy", producer=make)
        steady = manager.subscribe("abandon", "steady", producer=make)
        results: list[Any] = await asyncio.gather(
            consume(crashy, 1, crash_on="m"), consume(steady, 2), return_exceptions=True
        )
    crashed, seen = results
    assert isinstance(crashed, RuntimeError) and isinstance(seen, list)
    assert [(str(m), m.delivery_count) for m in seen] == [("m", 0), ("m", 1)]
    assert await peek(connection_string, "abandon") == []


async def test_sessions_keep_their_order_and_are_taken_in_turn(connection_string: str) -> None:
    await send(connection_string, "sessions", ["a1", "a2", "a3"], session_id="A")
    await send(connection_string, "sessions", ["b1", "b2"], session_id="B")
    make = producer(
        connection_string,
        queue_name="sessions",
        session_id=NEXT_AVAILABLE_SESSION,
        max_wait_time=3.0,  # also bounds taking a session
    )
    async with SharedStreamManager() as manager:
        seen = await consume(manager.subscribe("sessions", "x", producer=make), 5)
    by_session: dict[str, list[str]] = {}
    for message in seen:
        by_session.setdefault(message.session_id, []).append(str(message))
    assert by_session == {"A": ["a1", "a2", "a3"], "B": ["b1", "b2"]}
    assert await peek(connection_string, "sessions") == []


async def test_lock_renewal_outlasts_a_five_second_lock(connection_string: str) -> None:
    await send(connection_string, "renew", ["slow"])
    make = producer(connection_string, queue_name="renew", lock_renewal_margin=3.0)
    async with SharedStreamManager() as manager:
        sub = manager.subscribe("renew", "x", producer=make)
        async with asyncio.timeout(60), sub:
            async for message in sub:
                await asyncio.sleep(12)  # the handler's slow work: over two lock durations
                assert message.delivery_count == 0
                break
    assert await peek(connection_string, "renew") == []  # completed, not left to expire
