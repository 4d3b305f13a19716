"""One scenario: a fresh topic and group, three hosts, keyed messages produced at a steady
rate, a fault while they flow, and the books checked once everything is committed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from accounting import Produced, Records, Timeline, below
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from cluster import Cluster
from hosts import Host
from network import Network

HOSTS = ("h1", "h2", "h3")


@dataclass(frozen=True)
class Size:
    messages: int
    partitions: int
    keys: int
    produce_seconds: float  # production is spread over this long
    fault_at: float  # the fault starts once this share of the messages is produced
    drain_timeout: float


@dataclass
class Run:
    """What a fault needs, and what it notes down."""

    name: str
    network: Network
    cluster: Cluster
    hosts: dict[str, Host]
    admin: AIOKafkaAdminClient
    topic: str
    group: str
    records: Path
    timeline: Timeline = field(default_factory=Timeline)
    early_checks: list[dict[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _fault: tuple[str, float] = ("", 0.0)

    def fault(self, what: str) -> None:
        """Note that ``what`` begins now."""
        self._fault = (what, time.monotonic())

    def held(self) -> None:
        """Note that the fault begun last has taken hold (see :meth:`Timeline.recovery`)."""
        what, began = self._fault
        self.timeline.faults.append((what, began, time.monotonic()))

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic() - self.started:6.1f}s  {text}")

    async def committed(self, attempts: int = 1) -> dict[int, int]:
        """The group's committed offsets; ``attempts`` tries, 10 s each, while a broker
        is down or the coordinator moves."""
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(10):
                    offsets = await self.admin.list_consumer_group_offsets(self.group)
                break
            except Exception:
                if attempt == attempts:
                    raise
                await asyncio.sleep(1)
        return {tp.partition: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}

    async def check_early(self) -> None:
        """Every offset below the committed ones is recorded by every handler (the
        commit read first, the records after)."""
        committed = await self.committed(attempts=10)
        records = await asyncio.to_thread(Records.read, self.records)
        self.early_checks.append(records.missing(below(committed)))

    async def leaders(self) -> dict[int, int]:
        """Partition -> node id of its leader."""
        async with asyncio.timeout(10):
            (described,) = await self.admin.describe_topics([self.topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}


Fault = Callable[[Run], Awaitable[None]]


async def produce(
    bootstrap: str,
    topic: str,
    size: Size,
    produced: list[Produced],
    ends: dict[int, int],
    fault_due: asyncio.Event,
) -> None:
    """Every message, keyed, at a steady rate; ``produced`` and ``ends`` grow as the
    cluster acknowledges them (acks=all, idempotent: each once, in order per partition)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        tick = 0.1
        per_tick = max(1, round(size.messages * tick / size.produce_seconds))
        started = time.monotonic()
        for first in range(0, size.messages, per_tick):
            batch = range(first, min(first + per_tick, size.messages))
            sends = []
            for n in batch:
                key, seq = f"k{n % size.keys}", n // size.keys
                value = f"{key} {seq}".encode()
                sends.append((key, seq, await producer.send(topic, value, key=key.encode())))
            for key, seq, sent in sends:
                meta = await sent
                produced.append(Produced(key, seq, meta.partition, meta.offset))
                ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
            if len(produced) >= size.fault_at * size.messages:
                fault_due.set()
            await asyncio.sleep(
                max(0.0, started + (first // per_tick + 1) * tick - time.monotonic())
            )
    finally:
        await producer.stop()


async def poll(run: Run, ends: dict[int, int], every: float = 0.5) -> None:
    """Committed offsets into the timeline until cancelled; a poll that fails (a broker
    down, the coordinator moving) is skipped."""
    while True:
        with contextlib.suppress(Exception):
            committed = await run.committed()
            run.timeline.add(time.monotonic(), committed, ends)
        await asyncio.sleep(every)


async def drained(run: Run, ends: dict[int, int], partitions: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            committed = await run.committed()
            if len(ends) == partitions and all(committed.get(p) == e for p, e in ends.items()):
                return True
        await asyncio.sleep(0.5)
    return False


async def run_scenario(
    name: str,
    fault: Fault,
    size: Size,
    network: Network,
    cluster: Cluster,
    workdir: Path,
) -> dict[str, object]:
    suffix = network.run_id
    topic, group = f"mh-{name}-{suffix}", f"g-{name}-{suffix}"
    records = workdir / name / "records"
    records.mkdir(parents=True)
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=10000)
    await admin.start()
    env = {"MH_BOOTSTRAP": cluster.bootstrap, "MH_TOPIC": topic, "MH_GROUP": group}
    env["MH_RECORDS"] = str(records)
    hosts = {h: Host(network, h, env, workdir / name / f"{h}.log") for h in HOSTS}
    run = Run(name, network, cluster, hosts, admin, topic, group, records)
    produced: list[Produced] = []
    ends: dict[int, int] = {}
    fault_due = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        topic_config = {"min.insync.replicas": "2"}
        await admin.create_topics([NewTopic(topic, size.partitions, 3, topic_configs=topic_config)])
        for host in hosts.values():
            host.start()
        readiness = await asyncio.gather(*(host.ready(120) for host in hosts.values()))
        run.note(f"hosts ready in {max(readiness):.1f}s")
        run.started = time.monotonic()
        producing = asyncio.create_task(
            produce(cluster.bootstrap, topic, size, produced, ends, fault_due)
        )
        due = asyncio.create_task(fault_due.wait())
        tasks += [producing, due, asyncio.create_task(poll(run, ends))]
        await asyncio.wait([producing, due], return_when=asyncio.FIRST_COMPLETED)
        await fault(run)
        await producing
        run.note("all produced")
        complete = await drained(run, ends, size.partitions, size.drain_timeout)
        run.note("all committed" if complete else "NOT all committed")
        await run.check_early()
        for host in hosts.values():
            if host.process is not None:
                await host.terminate()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for host in hosts.values():
            host.kill()
        await admin.close()
    books = Records.read(records)
    positions = {(m.partition, m.offset) for m in produced}
    early = {h: max(check[h] for check in run.early_checks) for h in books.deliveries}
    recoveries = [
        (what, run.timeline.recovery(began, held, ends), began - run.started)
        for what, began, held in run.timeline.faults
    ]
    return {
        "scenario": name,
        "produced": len(produced),
        "complete": complete,
        "lost": books.missing(positions),
        "early": early,
        "early_checks": len(run.early_checks),
        "order_violations": books.order_violations(),
        "duplicates": books.duplicates(),
        "recoveries": recoveries,
        "notes": run.notes,
    }
