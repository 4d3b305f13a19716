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

A broker that is *frozen* (SIGSTOPped, a hung JVM, a network that drops packets
without a reset) keeps its connections: the coordinator stays known until aiokafka's
request timeout (40 s) runs out. So each check also asks the coordinator for its API
versions (``ApiVersions``, the cheapest request there is, answered before any
authentication) on a connection of the watch's own, and gives it
:data:`_ANSWER_TIMEOUT` seconds: no answer counts as a missed check, so a frozen
broker is reported within about ``2 x (CHECK_INTERVAL + _ANSWER_TIMEOUT)`` = 6 s
(test: ``tests/adapters/kafka/test_kafka_frozen.py``).

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
import struct
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger("ackgate.adapters.kafka")

#: Seconds between two checks of the coordinator.
CHECK_INTERVAL = 1.0
#: Consecutive checks without a coordinator that make an outage.
_CHECKS_TO_LOSE = 2
#: Seconds a TCP connect to one bootstrap server may take when finding the cause.
_PROBE_TIMEOUT = 2.0
#: Seconds the coordinator has to answer the watch's ``ApiVersions`` request.
_ANSWER_TIMEOUT = 2.0
#: What ``_check`` says when the consumer has no coordinator (the cause is probed).
_NO_COORDINATOR = "no coordinator"
_API_VERSIONS = 18
_CLIENT_ID = b"ackgate-outage-watch"


class OutageWatch:
    """Reports the consumer's cluster lost and back to its producer.

    Caller: ``KafkaStreamProducer`` (``start()`` once its consumer joined,
    ``close()`` when the stream ends).
    """

    def __init__(
        self,
        consumer: Any,
        producer: Any,
        bootstrap_servers: str | Sequence[str],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._consumer = consumer
        options = options or {}
        protocol = str(options.get("security_protocol", "PLAINTEXT"))
        #: TLS for the watch's own connection when the consumer's is TLS.
        self._ssl = options.get("ssl_context") if protocol.endswith("SSL") else None
        #: The watch's connection to the coordinator: ``(node, reader, writer)``.
        self._connection: tuple[Any, asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = 0
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
        self._disconnect()

    def _coordinator_known(self) -> bool:
        # aiokafka's GroupCoordinator clears coordinator_id whenever a request to the
        # coordinator fails, and sets it again once one answers.
        return self._consumer._coordinator.coordinator_id is not None

    async def _run(self) -> None:
        missed = 0
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            problem = await self._check()
            if problem is None:
                missed = 0
                self._producer.upstream_back()
                continue
            missed += 1
            if missed == _CHECKS_TO_LOSE:
                if problem != _NO_COORDINATOR:  # frozen: the check was the probe
                    self._producer.upstream_lost(self.address, problem)
                    continue
                cause = await self._probe()
                if not self._coordinator_known():  # else: back while we probed, a blip
                    self._producer.upstream_lost(self.address, cause)

    async def _check(self) -> str | None:
        """``None`` when the coordinator is known and answers; else what is wrong."""
        if not self._coordinator_known():
            return _NO_COORDINATOR
        node = self._consumer._coordinator.coordinator_id
        broker = self._consumer._client.cluster.broker_metadata(node)
        if broker is None:  # not in the metadata (yet): nothing to ask
            return None
        address = f"{broker.host}:{broker.port}"
        try:
            async with asyncio.timeout(_ANSWER_TIMEOUT):
                await self._ask(node, broker.host, broker.port)
        except TimeoutError:
            self._disconnect()  # a late answer must not be read as the next one's
            return (
                f"the coordinator {address} did not answer an ApiVersions request within "
                f"{_ANSWER_TIMEOUT:g}s (the broker is frozen or overloaded)"
            )
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            self._disconnect()
            return f"the coordinator {address}: {type(exc).__name__}: {exc}".rstrip(": ")
        return None

    async def _ask(self, node: Any, host: str, port: int) -> None:
        """One ``ApiVersions`` (v0) request to ``node`` and its answer (any answer: a
        broker that does not support v0 answers it too, with an error code)."""
        if self._connection is None or self._connection[0] != node:
            self._disconnect()
            reader, writer = await asyncio.open_connection(host, port, ssl=self._ssl)
            self._connection = (node, reader, writer)
        _, reader, writer = self._connection
        self._correlation = (self._correlation + 1) % 2**31
        header = (
            struct.pack(">hhih", _API_VERSIONS, 0, self._correlation, len(_CLIENT_ID)) + _CLIENT_ID
        )
        writer.write(struct.pack(">i", len(header)) + header)
        await writer.drain()
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        answer = await reader.readexactly(size)
        if size < 4 or struct.unpack(">i", answer[:4])[0] != self._correlation:
            raise ValueError("an answer that is not to the request")

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection[2].close()
            self._connection = None

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
