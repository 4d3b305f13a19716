"""Duplicates after SIGKILLs: a three-handler Service on Kafka, killed and restarted.

    python benchmarks/kafka_sigkill.py [--bootstrap HOST:PORT] [--messages 10000] [--kills 5]

Without ``--bootstrap`` (or ``ACKGATE_KAFKA_BOOTSTRAP``) it starts a broker the way the
tests do. It writes ``--messages`` records (``b"<n>"``) over ``--partitions``, then runs
the consumer (this file with ``consume``: an ``ackgate.Service`` whose handlers
``indexer``, ``auditor`` and ``notifier`` each log every message they handled) as a
subprocess, SIGKILLs it ``--kills`` times at even steps of progress (messages handled by
the indexer) and runs it once more until everything is committed. The notifier
(``Retry(attempts=2)``) fails every call of ``--fail-percent`` of the messages (1 % by
default, by offset, in every partition) the first time this process is handed it, so that
delivery fails for the broker: the partition is held there and the message
redelivered, while the messages after it are handled. A kill then loses the process's
memory of what it handled past the held offsets; the offset map committed with them is
what spares the restart from replaying them. What the handlers did not all finish is
replayed to all of them: with fast handlers far ahead of a slow one, that is up to
``--max-outstanding`` messages per kill.

Prints, per handler, the messages handled more than once (duplicates, as a share of
the messages) and fails if any message was not handled by every handler. ``--json``
prints the figures as one JSON object instead (the test suite runs a small size).
Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import IO

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

HANDLERS = ("indexer", "auditor", "notifier")


# The consumer: a subprocess, started once per life.


def consume(
    bootstrap: str,
    topic: str,
    group: str,
    dlq: str,
    workdir: Path,
    every: int,
    max_outstanding: int,
) -> None:
    from ackgate import Message, Retry, Service
    from ackgate_kafka import KafkaStreamProducer

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            dlq_topic=dlq,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    options = {"max_outstanding": max_outstanding} if max_outstanding else {}
    service = Service("sigkill", producer=make, restart_backoff=0.5, **options)
    # O_APPEND writes reach the file even when the process is killed right after.
    logs = {
        sid: os.open(workdir / f"{sid}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for sid in HANDLERS
    }
    calls: Counter[str] = Counter()
    pid = os.getpid()
    if os.environ.get("ACKGATE_SIGKILL_DEBUG"):
        logging.basicConfig(
            level=logging.DEBUG, format="%(asctime)s %(process)d %(name)s %(message)s"
        )
        logging.getLogger("aiokafka").setLevel(logging.WARNING)

    def done(sid: str, message: Message) -> None:
        raw = message.raw
        os.write(logs[sid], f"{raw.partition} {raw.offset} {pid} {message.attempt}\n".encode())

    @service.handler("indexer")
    async def indexer(message: Message) -> None:
        done("indexer", message)

    @service.handler("auditor")
    async def auditor(message: Message) -> None:
        done("auditor", message)

    @service.handler("notifier", retry=Retry(attempts=2, backoff=0.01, max_backoff=0.02))
    async def notifier(message: Message) -> None:
        calls[message.id] += 1
        if message.raw.offset % every == every // 3 and calls[message.id] <= 2:
            raise RuntimeError(f"{message.id}: down for its first delivery in this process")
        done("notifier", message)

    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, lambda: asyncio.ensure_future(service.stop())
        )
        await service.run()

    asyncio.run(main())


# The driver.


def handled(workdir: Path, sid: str) -> Counter[tuple[int, int]]:
    seen: Counter[tuple[int, int]] = Counter()
    path = workdir / f"{sid}.log"
    if path.exists():
        for line in path.read_text().splitlines():
            p, o = line.split()[:2]
            seen[int(p), int(o)] += 1
    return seen


async def committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return {tp: meta.offset for tp, meta in offsets.items()}
    finally:
        await admin.close()


def start(command: list[str], errors: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stderr=errors)


async def run(args: argparse.Namespace, bootstrap: str, workdir: Path) -> dict[str, object]:
    suffix = uuid.uuid4().hex[:10]
    topic, group, dlq = f"sigkill-{suffix}", f"g-{suffix}", f"sigkill-dlq-{suffix}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, args.partitions, 1), NewTopic(dlq, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, str(n).encode(), partition=n % args.partitions)
            for n in range(args.messages)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    every = round(100 / args.fail_percent)
    command = [sys.executable, __file__, "consume", bootstrap, topic, group, dlq]
    command += [str(workdir), str(every), str(args.max_outstanding)]
    errors = (workdir / "consumer.err").open("ab")
    ends = {
        TopicPartition(topic, p): -(-(args.messages - p) // args.partitions)
        for p in range(args.partitions)
    }
    started = time.monotonic()
    kills: list[int] = []
    for k in range(1, args.kills + 1):
        process = start(command, errors)
        target = k * args.messages // (args.kills + 1)
        try:
            async with asyncio.timeout(args.timeout):
                # Another process writes the logs: nothing to await, so poll them.
                while len(handled(workdir, "indexer")) < target:
                    if process.poll() is not None:
                        raise RuntimeError("the consumer exited early; see consumer.err")
                    await asyncio.sleep(0.05)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        kills.append(len(handled(workdir, "indexer")))
    process = start(command, errors)
    try:
        async with asyncio.timeout(args.timeout):
            while (await committed(bootstrap, group)) != ends:
                if process.poll() is not None:
                    raise RuntimeError("the consumer exited early; see consumer.err")
                await asyncio.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        if process.wait(timeout=30) != 0:
            raise RuntimeError("the consumer did not stop cleanly; see consumer.err")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    every_position = {(n % args.partitions, n // args.partitions) for n in range(args.messages)}
    figures: dict[str, object] = {"messages": args.messages, "kills": kills}
    for sid in HANDLERS:
        seen = handled(workdir, sid)
        figures[sid] = {
            "duplicates": sum(seen.values()) - len(seen),
            "lost": len(every_position - set(seen)),
        }
    figures["seconds"] = round(time.monotonic() - started, 1)
    return figures


def main() -> None:
    if sys.argv[1:2] == ["consume"]:
        bootstrap, topic, group, dlq, workdir, every, outstanding = sys.argv[2:9]
        consume(bootstrap, topic, group, dlq, Path(workdir), int(every), int(outstanding))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("ACKGATE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--fail-percent", type=float, default=1.0)
    parser.add_argument(
        "--max-outstanding", type=int, default=0, help="the Service's (0: its default)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per life")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workdir", help="keep the logs here (default: a temporary directory)")
    args = parser.parse_args()
    with (
        contextlib.nullcontext(args.workdir)
        if args.workdir
        else tempfile.TemporaryDirectory() as workdir
    ):
        if args.bootstrap:
            figures = asyncio.run(run(args, args.bootstrap, Path(workdir)))
        else:
            from ackgate.testing.brokers import broker

            with broker("kafka") as kafka:
                figures = asyncio.run(run(args, kafka.bootstrap, Path(workdir)))
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"{args.messages} messages, {args.kills} SIGKILLs (indexer progress {figures['kills']})"
        )
        for sid in HANDLERS:
            f = figures[sid]
            assert isinstance(f, dict)
            share = 100 * f["duplicates"] / args.messages
            print(f"  {sid:9} duplicates {f['duplicates']:6} ({share:5.1f} %)  lost {f['lost']}")
        print(f"  {figures['seconds']} s")
    if any(isinstance(f, dict) and f["lost"] for f in figures.values()):
        sys.exit("messages were lost")


if __name__ == "__main__":
    main()
