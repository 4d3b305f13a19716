"""Notice when the Kafka cluster is unreachable, and when it is back
(docs/failure-semantics.md#broker-outages).

aiokafka rides out a lost broker by itself: ``getmany`` keeps returning nothing,
``commit`` keeps retrying, and every failed retry is logged on aiokafka's loggers,
while nothing reaches the caller. The one state that reliably flips is the consumer
group's *coordinator*: any failed request to it (the heartbeat every
``heartbeat_interval_ms`` included) marks it dead, and aiokafka looks it up again
until a broker answers and the coordinator accepts a connection. So an
:class:`OutageWatch` task checks it once a second: unknown on two checks in a row
means the upstream is lost (reported with ``upstream_lost``, the cause found by a
TCP connect to the bootstrap servers); known again means it is back
(``upstream_back``). A check in between that sees it known (a coordinator moving
during a rebalance) resets the count, so a rebalance is no outage.

The group stays up through the outage: the stream waits in ``getmany``, an advance
waits in ``commit`` (nothing is committed while the cluster is away), and both go on
when it returns.

The producer's ``upstream_*`` methods are idempotent, so the watch reports "back"
on every check that finds a coordinator: an outage that began under an earlier
producer of the same service (one whose group ended meanwhile) ends here too. Test:
``tests/adapters/kafka/test_kafka_outage.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("ackgate.adapters.kafka")

#: Seconds between two checks of the coordinator.
CHECK_INTERVAL = 1.0
#: Consecutive checks without a coordinator that make an outage.
_CHECKS_TO_LOSE = 2
#: Seconds a TCP connect to one bootstrap server may take when finding the cause.
_PROBE_TIMEOUT = 2.0


class OutageWatch:
    """Reports the consumer's cluster lost and back to its producer.

    Caller: ``KafkaStreamProducer`` (``start()`` once its consumer joined,
    ``close()`` when the stream ends).
    """

    def __init__(
        self, consumer: Any, producer: Any, bootstrap_servers: str | Sequence[str]
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        servers = (
            bootstrap_servers.split(",")
            if isinstance(bootstrap_servers, str)
            else list(bootstrap_servers)
        )
        self._servers = [server.strip() for server in servers if server.strip()]
        self.address = ",".join(self._servers)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ackgate-kafka-outage-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _coordinator_known(self) -> bool:
        # aiokafka's GroupCoordinator clears coordinator_id whenever a request to the
        # coordinator fails, and sets it again once one answers.
        return self._consumer._coordinator.coordinator_id is not None

    async def _run(self) -> None:
        missed = 0
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            if self._coordinator_known():
                missed = 0
                self._producer.upstream_back()
                continue
            missed += 1
            if missed == _CHECKS_TO_LOSE:
                cause = await self._probe()
                if not self._coordinator_known():  # else: back while we probed, a blip
                    self._producer.upstream_lost(self.address, cause)

    async def _probe(self) -> str:
        """Why the cluster is unreachable, as far as a TCP connect can tell."""
        failures = []
        for server in self._servers:
            host, _, port = server.rpartition(":")
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT):
                    _, writer = await asyncio.open_connection(host or server, int(port or 9092))
            except (OSError, TimeoutError, ValueError) as exc:
                failures.append(f"{server}: {type(exc).__name__}: {exc}".rstrip(": "))
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return (
                f"no group coordinator for {_CHECKS_TO_LOSE * CHECK_INTERVAL:.0f}s, though "
                f"{server} accepts connections (the coordinator is moving or unavailable)"
            )
        return "; ".join(failures)
