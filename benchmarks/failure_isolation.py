"""A failure costs only its handler and its key, measured on genuine Kafka (issue #27).

    python benchmarks/failure_isolation.py [--bootstrap HOST:PORT] [--messages 20000]

Without ``--bootstrap`` (or ``ACKGATE_KAFKA_BOOTSTRAP``) it starts a local KRaft broker the
way the tests do. One topic of ``--messages`` records (default 20,000) over 401 keys and 4
partitions is written once; every run reads all of it in a fresh consumer group, with a
fresh DLQ topic, through one ``Service`` of three handlers (the issue's scenario 1):

* ``store``: per message, ``concurrency=16``, ``ordering="key"``;
* ``audit``: batches of 500 (``batch_wait=0.05``);
* ``notify``: per message, ``ordering="key"``, ``give_up_after=3``.

Runs, each timed from the first handler call (after one warm-up run, not shown):

1. **failure-free**: the baseline every ratio is against;
2. **notify failing 1 %**: 1 % of the messages (one each on as many keys, each the
   25th message of its key) fail in ``notify`` every time;
3. **+ store rejecting 1 %**: the same, and ``store`` rejects another 1 %;
4. **failing forever**: ``notify`` without ``give_up_after`` fails one message every
   time, watched for 25 s (``--forever``).

It prints, against the failure-free run of the same invocation: when ``store`` and
``audit`` had handled everything, when ``notify`` had handled everything that is not
behind a failing message of its own key, when everything was committed (and
dead-lettered), the calls and attempts of each poison message, each rejected message's
count in the DLQ, per-key order, and the duplicate deliveries per handler. Default
``Redelivery()`` (1 s doubling to 60 s). The machine is shared: read the ratios, not
the absolute times. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from ackgate import Message, Reject, Service
from ackgate_kafka import KafkaStreamProducer

TEST_SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"
KEYS = 401
PARTITIONS = 4


def key_of(n: int) -> int:
    return n % KEYS


@dataclass
class Run:
    """What one run saw, in loop time from its first handler call."""

    name: str
    started: float | None = None
    healthy_done: float | None = None
    notify_done: float | None = None
    committed: float | None = None
    calls: dict[str, Counter[int]] = field(
        default_factory=lambda: {h: Counter() for h in ("store", "audit", "notify")}
    )
    order: dict[str, dict[int, list[int]]] = field(
        default_factory=lambda: {h: defaultdict(list) for h in ("store", "notify")}
    )
    attempts: dict[int, list[int | None]] = field(default_factory=lambda: defaultdict(list))
    where: dict[int, tuple[int, int]] = field(default_factory=dict)
    dlq: Counter[int] = field(default_factory=Counter)
    #: Committed offsets when the run stopped, and the partitions' end offsets.
    final: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)

    def at(self) -> float:
        now = asyncio.get_running_loop().time()
        if self.started is None:
            self.started = now
        return now - self.started


async def fill(bootstrap: str, topic: str, messages: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, str(n).encode(), key=b"k%d" % key_of(n))
            for n in range(messages)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def ends(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        result: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return result
    finally:
        await consumer.stop()


async def committed(admin: AIOKafkaAdminClient, group: str) -> dict[TopicPartition, int]:
    offsets = await admin.list_consumer_group_offsets(group)
    return {tp: meta.offset for tp, meta in offsets.items()}


async def read_dlq(bootstrap: str, topic: str, expected: int) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            records.extend(r for part in batch.values() for r in part)
            if len(records) >= expected and not batch:
                break
        return records
    finally:
        await consumer.stop()


async def run_once(
    bootstrap: str,
    topic: str,
    messages: int,
    name: str,
    poison: Callable[[int], bool],
    torn: Callable[[int], bool],
    give_up: int | None = 3,
    watch: float | None = None,
) -> Run:
    run = Run(name)
    group, dlq = f"iso-{uuid.uuid4().hex[:8]}", f"iso-dlq-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(dlq, 1, 1)])
    service = Service(
        name,
        producer=lambda: KafkaStreamProducer(
            topic, bootstrap_servers=bootstrap, group_id=group, dlq_topic=dlq
        ),
    )
    everything = set(range(messages))
    # notify's messages that wait behind a failing message of their key.
    behind = {
        n
        for n in everything
        if any(poison(p) for p in range(n - KEYS, -1, -KEYS))  # its key's earlier ones
    }
    notify_owed = len(everything - behind - {n for n in everything if poison(n)})
    healthy = asyncio.Event()
    notified = asyncio.Event()
    counts = {"store": 0, "audit": 0, "notify": 0}

    def check() -> None:
        if run.healthy_done is None and counts["store"] >= messages <= counts["audit"]:
            run.healthy_done = run.at()
            healthy.set()
        if run.notify_done is None and counts["notify"] >= notify_owed:
            run.notify_done = run.at()
            notified.set()

    @service.handler("store", concurrency=16, ordering="key")
    async def store(message: Message) -> None:
        run.at()
        n = int(message.body)
        run.calls["store"][n] += 1
        run.order["store"][key_of(n)].append(n)
        if run.calls["store"][n] == 1:
            counts["store"] += 1
            check()
        if torn(n):
            raise Reject("torn row")

    @service.handler("audit", batch_size=500, batch_wait=0.05)
    async def audit(batch: list[Message]) -> None:
        run.at()
        for message in batch:
            n = int(message.body)
            run.calls["audit"][n] += 1
            if run.calls["audit"][n] == 1:
                counts["audit"] += 1
        check()

    @service.handler("notify", ordering="key", give_up_after=give_up)
    async def notify(message: Message) -> None:
        run.at()
        n = int(message.body)
        run.calls["notify"][n] += 1
        run.order["notify"][key_of(n)].append(n)
        if poison(n):
            run.attempts[n].append(message.attempt)
            run.where[n] = (message.raw.partition, message.raw.offset)
            raise ConnectionError("mail server refused it")
        if run.calls["notify"][n] == 1 and n not in behind:
            counts["notify"] += 1
            check()

    end = await ends(bootstrap, topic)
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(watch or 180):
            await healthy.wait()
            await notified.wait()
            while True:
                done = await committed(admin, group)
                if watch is None and all(done.get(tp) == end[tp] for tp in end):
                    run.committed = run.at()
                    break
                await asyncio.sleep(0.1)
    except TimeoutError:
        if watch is None:
            raise
    final = await committed(admin, group)
    await service.stop()
    await task
    run.final = {tp.partition: offset for tp, offset in final.items()}
    run.end = {tp.partition: offset for tp, offset in end.items()}
    rejected = sum(1 for n in everything if poison(n) or torn(n)) if give_up else 0
    for record in await read_dlq(bootstrap, dlq, rejected):
        run.dlq[int(record.value)] += 1
    await admin.close()
    return run


def duplicates(run: Run, handler: str, poison: Callable[[int], bool]) -> int:
    extra = 0
    for n, count in run.calls[handler].items():
        expected = len(run.attempts[n]) if handler == "notify" and poison(n) else 1
        extra += max(0, count - expected)
    return extra


def key_order_kept(run: Run) -> bool:
    for calls in run.order.values():
        for each in calls.values():
            distinct = [n for i, n in enumerate(each) if i == 0 or each[i - 1] != n]
            if distinct != sorted(set(distinct)):
                return False
    return True


async def bench(bootstrap: str, messages: int, forever: float) -> None:
    topic = f"iso-{uuid.uuid4().hex[:8]}"
    await fill(bootstrap, topic, messages)
    failing = messages // 100
    poisoned = {KEYS * 25 + k for k in range(failing)}
    if max(poisoned) >= messages:
        raise SystemExit(f"--messages must be at least {max(poisoned) + 1}")

    def poison(n: int) -> bool:
        return n in poisoned

    torn_set = {n for n in range(messages) if n % 100 == 53 and n not in poisoned}

    def torn(n: int) -> bool:
        return n in torn_set

    def never(n: int) -> bool:
        return False

    print(f"{messages} messages, {KEYS} keys, {PARTITIONS} partitions; {failing} poison")
    # A first run warms the broker and the interpreter up; it is not compared.
    await run_once(bootstrap, topic, messages, "warm-up", never, never)
    base = await run_once(bootstrap, topic, messages, "failure-free", never, never)
    one = await run_once(bootstrap, topic, messages, "notify failing 1%", poison, never)
    both = await run_once(bootstrap, topic, messages, "+ store rejecting 1%", poison, torn)
    lone = KEYS * 25 + 7

    def lone_poison(n: int) -> bool:
        return n == lone

    stuck = await run_once(
        bootstrap, topic, messages, "failing forever", lone_poison, never, None, forever
    )
    assert base.healthy_done and base.notify_done and base.committed
    print()
    print(f"{'run':24} {'store+audit':>12} {'notify*':>9} {'committed':>10}")
    for run in (base, one, both, stuck):
        print(
            f"{run.name:24} {run.healthy_done or 0:11.2f}s {run.notify_done or 0:8.2f}s "
            + (f"{run.committed:9.2f}s" if run.committed else f"{'-':>10}")
        )
    print("(* notify: every message not behind a failing message of its own key)")
    print()
    for run in (one, both):
        assert run.healthy_done and run.notify_done and run.committed
        limit = 1.5 * base.healthy_done + 0.5
        print(f"== {run.name}")
        print(
            f"store+audit: {run.healthy_done / base.healthy_done:.2f}x the failure-free time "
            f"({'within' if run.healthy_done <= limit else 'OVER'} 1.5x + 0.5 s = {limit:.2f}s)"
        )
        notify_limit = 1.5 * base.notify_done + 0.5
        print(
            f"notify*: {run.notify_done / base.notify_done:.2f}x "
            f"({'within' if run.notify_done <= notify_limit else 'OVER'} 1.5x + 0.5 s)"
        )
        late = run.committed - base.committed
        print(
            f"committed and dead-lettered {late:+.2f}s after the failure-free run "
            f"({'within' if late <= 15 else 'OVER'} +15 s)"
        )
        calls = Counter(len(v) for v in run.attempts.values())
        exact = all(v == [1, 2, 3] for v in run.attempts.values())
        print(f"notify calls per poison message: {dict(calls)}; attempts all [1, 2, 3]: {exact}")
        rejected = {n for n in range(messages) if poison(n) or (run is both and torn(n))}
        once = all(run.dlq[n] == 1 for n in rejected) and set(run.dlq) == rejected
        print(
            f"DLQ: {len(rejected)} rejected, each exactly once: {once} "
            f"(counts seen: {dict(Counter(run.dlq.values()))})"
        )
        for handler in ("store", "audit", "notify"):
            extra = duplicates(run, handler, poison)
            print(f"duplicates {handler}: {extra} ({extra / messages:.2%})")
        print(f"per-key order kept: {key_order_kept(run)}")
        print()
    print(f"== failing forever, watched {forever:.0f}s")
    assert stuck.healthy_done and stuck.notify_done
    print(
        f"store+audit: {stuck.healthy_done / base.healthy_done:.2f}x; notify (all but the "
        f"key's later messages): {stuck.notify_done / base.notify_done:.2f}x"
    )
    calls_on_it = len(stuck.attempts[lone])
    print(
        f"notify called on it {calls_on_it} times "
        f"({'within' if 2 <= calls_on_it <= 20 else 'OUTSIDE'} 2..20)"
    )
    partition, offset = stuck.where[lone]
    where, end = stuck.final, stuck.end
    others = all(where.get(p) == end[p] for p in end if p != partition)
    print(
        f"other partitions committed to the end: {others}; its partition {partition} "
        f"committed at {where.get(partition)} (the message is at {offset}: "
        f"{'never past it' if (where.get(partition) or 0) <= offset else 'PAST IT'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("ACKGATE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--forever", type=float, default=25.0, help="seconds to watch run 4")
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(bench(args.bootstrap, args.messages, args.forever))
        return
    sys.path.insert(0, str(TEST_SUPPORT))
    from ackgate_test_support.kafka_broker import LocalKafkaBroker

    with (
        tempfile.TemporaryDirectory() as workdir,
        LocalKafkaBroker(Path(workdir), java_opts=("-Xms512m", "-Xmx1g")) as broker,
    ):
        asyncio.run(bench(broker.bootstrap, args.messages, args.forever))


if __name__ == "__main__":
    main()
