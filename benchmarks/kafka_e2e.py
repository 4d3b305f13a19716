"""End-to-end Kafka throughput: plain aiokafka vs ackgate with 1 and 4 subscribers.

    python benchmarks/kafka_e2e.py [--bootstrap HOST:PORT] [--messages 100000]

Without ``--bootstrap`` (or ``ACKGATE_KAFKA_BOOTSTRAP``) it starts a local KRaft broker
the way the tests do (jars fetched by Maven into ``~/.cache/ackgate``). It writes one
topic of ``--messages`` records, then consumes all of it from the start in a fresh
consumer group per run:

* **plain aiokafka**: ``getmany`` and one manual ``commit`` per fetched batch;
* **contract floor**: plain aiokafka plus what the bulk contract makes ackgate build
  whatever its design: per record a ``Message`` and four handlers reading its body;
  per fetched partition batch one ``AdvanceRun`` and one id interval (an ``IdRange``
  and one redelivery-memory entry for it), no per-id entry and no per-record
  ``AdvanceItem``; no fan-out, no bookkeeping, unsafe commits: the ceiling any
  Service row could reach;
* **bare fan-out x4**: aiokafka into four asyncio queues read by four async
  generators, committing per batch without waiting for them (unsafe: the ceiling
  of fanning out in CPython, for reference);
* **ackgate xN**: one :class:`KafkaStreamProducer` group, N subscribers that each read
  every record; the run ends when the last subscriber left and the group stopped
  (final commits done, consumer closed);
* **Service, 4 batch handlers**: an :class:`ackgate.Service` whose four handlers are
  batch handlers (``batch_size=500``, ``batch_wait=0.05``), and **Service, 4
  per-message handlers** (defaults: ``concurrency=1``, ``ordering="lane"``); each
  handler touches every message's body. The run ends when every handler has seen
  every message and ``service.stop()`` returned (final commits done);
* **plain aiokafka, GC as ackgate run** and **Service, 4 batch, GC as ackgate run**:
  those rows with the garbage collector's first-generation threshold that ``ackgate
  run`` sets (:func:`ackgate._operating.run_command.tune_gc`: 10,000 instead of CPython's 700), so
  both the gain and the like-for-like share of plain aiokafka show (the other rows
  keep the interpreter's defaults, as a ``Service`` embedded in an application does);
* **Service, 4 batch + OTel**: the batch row with OpenTelemetry's SDK configured as
  ``ackgate run --metrics-port`` does (a ``MeterProvider`` read by the Prometheus
  exporter, scraped every second) plus a ``TracerProvider`` whose batch span processor
  exports to nowhere: the cost of the instrumentation itself.

Variants run in interleaved rounds (``--repeat``, default 3): one run of each variant
per round, so a slow spell of the shared machine hits every variant alike. The table
shows each variant's median rate over the rounds and, as a second column, its best.
The last lines give a verdict, on the medians, for each target of issue #22: the
batch Service row at least 60 % of plain aiokafka, the per-message Service row at
least 25 %, ackgate low-level with 4 subscribers at least 40 %, and the OTel row at
least 90 % of the batch row.

Time runs from the first record received to the end, so group joins do not count.
Each run checks afterwards that the committed offsets reached the end of the topic.
Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from ackgate import (
    AdvanceOutcome,
    AdvanceRun,
    IdRange,
    Message,
    Service,
    SharedStreamManager,
    Subscription,
)
from ackgate._operating.run_command import tune_gc
from ackgate_kafka import KafkaStreamProducer

TEST_SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"


async def fill_topic(bootstrap: str, topic: str, messages: int, partitions: int, size: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=262144)
    await producer.start()
    try:
        payload = b"x" * size
        pending = [await producer.send(topic, payload) for _ in range(messages)]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def committed_to_end(bootstrap: str, group: str, topic: str, partitions: int) -> bool:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        return [await consumer.committed(tp) for tp in tps] == [ends[tp] for tp in tps]
    finally:
        await consumer.stop()


async def consume_and_commit(
    bootstrap: str,
    topic: str,
    messages: int,
    group: str,
    on_fetch: Callable[[list[Any]], None],
) -> float:
    """``getmany`` until ``messages`` records, ``on_fetch`` per fetched partition batch,
    one manual commit per fetch. Returns when the first record arrived (perf_counter)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    seen, started = 0, 0.0
    try:
        while seen < messages:
            batch = await consumer.getmany(timeout_ms=1000)
            if batch and not started:
                started = time.perf_counter()
            offsets = {}
            for tp, records in batch.items():
                on_fetch(records)
                seen += len(records)
                offsets[tp] = records[-1].offset + 1
            if offsets:
                await consumer.commit(offsets)
    finally:
        await consumer.stop()
    return started


async def plain_aiokafka(bootstrap: str, topic: str, messages: int) -> tuple[float, str]:
    group = f"bench-plain-{uuid.uuid4().hex[:8]}"
    volume = 0

    def touch(records: list[Any]) -> None:
        # Every variant touches every record's value (volume) and nothing else.
        nonlocal volume
        for record in records:
            volume += len(record.value)

    started = await consume_and_commit(bootstrap, topic, messages, group, touch)
    return time.perf_counter() - started, group


async def contract_floor(bootstrap: str, topic: str, messages: int) -> tuple[float, str]:
    """What the bulk contract costs before any fan-out or bookkeeping: plain aiokafka
    plus, for every record, a ``Message`` that four handlers read the body of, and for
    every fetched partition batch one ``AdvanceRun`` and one id interval with its
    redelivery-memory entry. Commits per fetch without waiting for anyone (unsafe): a
    ceiling for the Service rows, not a consumer."""
    from ackgate_kafka._message import wrap_all

    group = f"bench-floor-{uuid.uuid4().hex[:8]}"
    # One entry per batch: (topic, partition) -> (first, end, handlers that acked).
    memory: dict[Any, tuple[int, int, int]] = {}
    clean = AdvanceOutcome(4, 0, 0)
    first_delivery = SimpleNamespace(attempt=1)
    volume = 0

    def per_batch(records: list[Any]) -> None:
        nonlocal volume
        head = records[0]
        tp = TopicPartition(head.topic, head.partition)
        batch = wrap_all(None, records, tp, [first_delivery] * len(records))
        ids = IdRange((head.topic, head.partition), head.offset, len(records))
        memory[ids.prefix] = (ids.first, ids.first + len(ids), 15)
        run = AdvanceRun(records, clean)
        for _ in range(4):
            for message in batch:
                volume += len(message.body)
        del run

    started = await consume_and_commit(bootstrap, topic, messages, group, per_batch)
    return time.perf_counter() - started, group


async def bare_fan_out(
    bootstrap: str, topic: str, messages: int, subscribers: int
) -> tuple[float, str]:
    """The ceiling of in-process fan-out: aiokafka into one asyncio.Queue per consumer,
    each consumer an async generator. Commits per batch without waiting for anyone, so
    it is *not* safe; it shows what fanning out alone costs in CPython."""
    group = f"bench-bare-{uuid.uuid4().hex[:8]}"
    queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in range(subscribers)]

    async def records(queue: asyncio.Queue[Any]) -> Any:
        while (record := await queue.get()) is not None:
            yield record

    async def read_all(queue: asyncio.Queue[Any]) -> None:
        volume = 0
        async for record in records(queue):
            volume += len(record.value)

    def fan_out(fetched: list[Any]) -> None:
        for record in fetched:
            for queue in queues:
                queue.put_nowait(record)

    readers = [asyncio.create_task(read_all(queue)) for queue in queues]
    try:
        started = await consume_and_commit(bootstrap, topic, messages, group, fan_out)
        for queue in queues:
            queue.put_nowait(None)
        await asyncio.gather(*readers)
    finally:
        for reader in readers:
            reader.cancel()
    return time.perf_counter() - started, group


async def with_ackgate(
    bootstrap: str, topic: str, messages: int, subscribers: int
) -> tuple[float, str]:
    group = f"bench-ackgate-{uuid.uuid4().hex[:8]}"
    first: list[float] = []

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(topic, bootstrap_servers=bootstrap, group_id=group)

    async def read_all(sub: Subscription) -> None:
        seen, volume = 0, 0
        async with sub:
            async for record in sub:
                if not first:
                    first.append(time.perf_counter())
                volume += len(record.value)
                seen += 1
                if seen == messages:
                    return  # leave cleanly: done with the last record

    async with SharedStreamManager() as manager:
        subs: list[Any] = [
            manager.subscribe(topic, f"sub-{i}", producer=make) for i in range(subscribers)
        ]
        await asyncio.gather(*(read_all(sub) for sub in subs))
        ended = time.perf_counter()
    return ended - first[0], group


async def with_service(
    bootstrap: str, topic: str, messages: int, handlers: int, batch_size: int
) -> tuple[float, str]:
    """A :class:`Service` with ``handlers`` handlers, per-message or batch (``batch_size``)."""
    group = f"bench-service-{uuid.uuid4().hex[:8]}"
    first: list[float] = []
    seen = [0] * handlers
    all_seen = asyncio.Event()

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(topic, bootstrap_servers=bootstrap, group_id=group)

    service = Service(topic, producer=make)

    def count(index: int, batch: list[Message]) -> None:
        if not first:
            first.append(time.perf_counter())
        volume = 0
        for message in batch:
            volume += len(message.body)
        seen[index] += len(batch)
        if all(n >= messages for n in seen):
            all_seen.set()

    for index in range(handlers):
        if batch_size > 1:

            async def on_batch(batch: list[Message], index: int = index) -> None:
                count(index, batch)

            service.handler(f"h{index}", batch_size=batch_size, batch_wait=0.05)(on_batch)
        else:

            async def on_message(message: Message, index: int = index) -> None:
                count(index, [message])

            service.handler(f"h{index}")(on_message)

    running = asyncio.create_task(service.run())
    try:
        await all_seen.wait()
        await service.stop()
        await running
    finally:
        running.cancel()
    return time.perf_counter() - first[0], group


async def with_run_gc(run: Callable[[], Awaitable[tuple[float, str]]]) -> tuple[float, str]:
    """``run()`` with the collector set up as ``ackgate run`` sets it, then restored.
    Exits if ``tune_gc`` changes nothing (not CPython's default thresholds): the row
    would silently repeat the untuned one."""
    before = gc.get_threshold()
    if not tune_gc():
        raise SystemExit(f"GC rows: tune_gc() left the collector as it was ({before})")
    try:
        return await run()
    finally:
        gc.set_threshold(*before)


async def with_otel(bootstrap: str, topic: str, messages: int) -> tuple[float, str]:
    """The batch Service row with the SDK, the Prometheus reader and a tracer provider."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from prometheus_client import CollectorRegistry, generate_latest

    from ackgate_test_support.otel import installed

    class Nowhere(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    registry = CollectorRegistry()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    meter_provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    with installed(meter_provider, tracer_provider):
        scrapes = 0

        async def scrape() -> None:  # as Prometheus would, from another thread
            nonlocal scrapes
            while True:
                await asyncio.sleep(1.0)
                await asyncio.to_thread(generate_latest, registry)
                scrapes += 1

        scraping = asyncio.create_task(scrape())
        try:
            result = await with_service(bootstrap, topic, messages, 4, 500)
        finally:
            scraping.cancel()
        if b"messaging_process_duration_seconds_count" not in generate_latest(registry):
            raise SystemExit("OTel row: the handlers' calls were not measured")
        return result


async def bench(bootstrap: str, messages: int, partitions: int, size: int, repeat: int) -> None:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    await fill_topic(bootstrap, topic, messages, partitions, size)
    variants: dict[str, Callable[[], Awaitable[tuple[float, str]]]] = {
        "plain aiokafka": lambda: plain_aiokafka(bootstrap, topic, messages),
        "contract floor (unsafe)": lambda: contract_floor(bootstrap, topic, messages),
        "bare fan-out x4 (unsafe)": lambda: bare_fan_out(bootstrap, topic, messages, 4),
        "ackgate, 1 subscriber": lambda: with_ackgate(bootstrap, topic, messages, 1),
        "ackgate, 4 subscribers": lambda: with_ackgate(bootstrap, topic, messages, 4),
        "Service, 4 batch handlers": lambda: with_service(bootstrap, topic, messages, 4, 500),
        "plain, GC as ackgate run": lambda: with_run_gc(
            lambda: plain_aiokafka(bootstrap, topic, messages)
        ),
        "Service batch, GC as run": lambda: with_run_gc(
            lambda: with_service(bootstrap, topic, messages, 4, 500)
        ),
        "Service, 4 batch + OTel": lambda: with_otel(bootstrap, topic, messages),
        "Service, 4 per-message": lambda: with_service(bootstrap, topic, messages, 4, 1),
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    # Interleaved rounds: each round runs every variant once, so the machine's slow
    # spells (it is shared) spread over all of them; the median of each is compared.
    for _ in range(repeat):
        for name, run in variants.items():
            seconds, group = await run()
            if not await committed_to_end(bootstrap, group, topic, partitions):
                raise SystemExit(f"{name}: committed offsets did not reach the end of the topic")
            rates[name].append(messages / seconds)
    median = {name: statistics.median(values) for name, values in rates.items()}
    best = {name: max(values) for name, values in rates.items()}
    baseline, best_baseline = median["plain aiokafka"], best["plain aiokafka"]
    print(
        f"\n{messages:,} messages of {size} B, {partitions} partitions, "
        f"median (and best) of {repeat} interleaved rounds"
    )
    print(
        f"{'consumer':<26} {'median msg/s':>12} {'vs plain':>9} {'best msg/s':>12} {'vs plain':>9}"
    )
    for name in variants:
        print(
            f"{name:<26} {median[name]:>12,.0f} {median[name] / baseline:>8.0%} "
            f"{best[name]:>12,.0f} {best[name] / best_baseline:>8.0%}"
        )
    targets = [
        ("Service, 4 batch handlers", "plain aiokafka", 0.60),
        ("Service, 4 per-message", "plain aiokafka", 0.25),
        ("ackgate, 4 subscribers", "plain aiokafka", 0.40),
        ("Service, 4 batch + OTel", "Service, 4 batch handlers", 0.90),
    ]
    for name, against, target in targets:
        ratio = median[name] / median[against]
        verdict = "meets" if ratio >= target else "misses"
        print(f"{name} / {against}: {ratio:.0%} ({verdict} the {target:.0%} target)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("ACKGATE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="record value size in bytes")
    parser.add_argument(
        "--repeat", type=int, default=3, help="interleaved rounds; the median of each is compared"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(TEST_SUPPORT))
    if args.bootstrap:
        asyncio.run(bench(args.bootstrap, args.messages, args.partitions, args.size, args.repeat))
        return
    from ackgate_test_support.kafka_broker import LocalKafkaBroker

    with tempfile.TemporaryDirectory() as workdir:
        # Full JIT and a bigger heap than in the tests: this measures throughput.
        java_opts = ("-Xms512m", "-Xmx1g")
        with LocalKafkaBroker(Path(workdir), java_opts=java_opts) as broker:
            asyncio.run(
                bench(broker.bootstrap, args.messages, args.partitions, args.size, args.repeat)
            )


if __name__ == "__main__":
    main()
