"""``ackgate run --workers 2`` vs one worker: a CPU-bound handler on Kafka, 4 partitions.

    python benchmarks/workers.py [--bootstrap HOST:PORT] [--messages 200000] [--repeat 2]

Without ``--bootstrap`` (or ``ACKGATE_KAFKA_BOOTSTRAP``) it starts a local KRaft broker
the way the tests do. One topic of ``--messages`` records over 4 partitions is read,
in a fresh consumer group per run, by ``ackgate run bench:service --workers N`` (a
subprocess) for N = 1 and 2, in interleaved rounds. The service has one per-message
handler that spends about 20 µs hashing each message (``--hash-us``; calibrated
here, then given to the workers). A run is timed from the first message handled (by
any worker) until the group's committed offsets reach the end of the topic, so
process start and the first group join do not count; the second worker's join (a
rebalance) does. A second figure times the last 80 % only (from 20 % committed),
after that rebalance. Prints messages/s per N and the ratios (the target is at least
1.6x on a 2-core machine; the Kafka broker shares those cores when it runs locally).
Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_e2e import TEST_SUPPORT, fill_topic  # the sibling benchmark

PARTITIONS = 4

APP = """
import hashlib
import os
import time

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer

ROUNDS = int(os.environ["ROUNDS"])
mark = os.path.join(os.environ["MARKS"], str(os.getpid()))
marked = False

service = Service(
    "bench",
    producer=lambda: KafkaStreamProducer(
        os.environ["TOPIC"], bootstrap_servers=os.environ["BOOTSTRAP"], group_id=os.environ["GROUP"]
    ),
)


@service.handler("hasher")
async def hasher(message: Message) -> None:
    global marked
    if not marked:
        marked = True
        with open(mark, "w") as file:
            file.write(repr(time.time()))
    digest = message.body
    for _ in range(ROUNDS):
        digest = hashlib.sha256(digest).digest()
"""


def calibrate(micros: float) -> int:
    """Rounds of sha256 over 32 bytes that take about ``micros`` µs here (the fastest of
    five timings: on a shared machine the slower ones measure the neighbours)."""
    rounds = 10_000
    per_round = float("inf")
    for _ in range(5):
        digest = b"x" * 32
        start = time.perf_counter()
        for _ in range(rounds):
            digest = hashlib.sha256(digest).digest()
        per_round = min(per_round, (time.perf_counter() - start) / rounds)
    return max(1, round(micros * 1e-6 / per_round))


async def committed_total(bootstrap: str, group: str) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError as error:
        if not error.retriable:  # a group that has not joined yet has no coordinator
            raise
        return 0
    finally:
        await admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if isinstance(tp, TopicPartition))


async def one_run(
    bootstrap: str, topic: str, messages: int, workers: int, rounds: int, workdir: Path
) -> tuple[float, float]:
    """``(messages/s from the first message handled, messages/s from 20 % committed)``."""
    group = f"bench-workers-{uuid.uuid4().hex[:8]}"
    marks = workdir / group
    marks.mkdir()
    env = dict(
        os.environ, BOOTSTRAP=bootstrap, TOPIC=topic, GROUP=group, MARKS=str(marks),
        ROUNDS=str(rounds),
    )  # fmt: skip
    command = [sys.executable, "-m", "ackgate", "run", "bench:service", "--workers", str(workers)]
    command += ["--log-level", "WARNING"]
    parent = await asyncio.create_subprocess_exec(*command, cwd=workdir, env=env)
    fifth: float | None = None
    try:
        while (done := await committed_total(bootstrap, group)) < messages:  # poll: no event
            if parent.returncode is not None:
                raise SystemExit(f"--workers {workers} exited with {parent.returncode}")
            if fifth is None and done >= messages // 5:
                fifth = time.time()
            await asyncio.sleep(0.1)
        ended = time.time()
        first = min(float(mark.read_text()) for mark in marks.iterdir())
    finally:
        if parent.returncode is None:
            parent.send_signal(signal.SIGTERM)
        await asyncio.wait_for(parent.wait(), 60)
    steady = messages * 4 / 5 / (ended - fifth) if fifth is not None else 0.0
    return messages / (ended - first), steady


async def bench(bootstrap: str, messages: int, repeat: int, micros: float) -> None:
    topic = f"bench-workers-{uuid.uuid4().hex[:8]}"
    await fill_topic(bootstrap, topic, messages, PARTITIONS, 100)
    rounds = calibrate(micros)
    best = {1: [0.0, 0.0], 2: [0.0, 0.0]}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "bench.py").write_text(APP)
        for _ in range(repeat):  # interleaved: the machine is shared
            for workers, kept in best.items():
                rates = await one_run(bootstrap, topic, messages, workers, rounds, workdir)
                print(
                    f"--workers {workers}: {rates[0]:,.0f} messages/s "
                    f"({rates[1]:,.0f} from 20 % committed)",
                    flush=True,
                )
                kept[:] = map(max, kept, rates)
    print(
        f"\n{messages:,} messages, {PARTITIONS} partitions, ~{micros:g} µs of hashing each "
        f"({rounds} sha256 rounds), best of {repeat}, {os.cpu_count()} CPUs"
    )
    print(f"{'':<12} {'whole run':>12} {'from 20 %':>12}  (messages/s)")
    for workers, (whole, steady) in best.items():
        print(f"--workers {workers} {whole:>12,.0f} {steady:>12,.0f}")
    for index, what in enumerate(("whole run", "from 20 % committed (after the rebalance)")):
        ratio = best[2][index] / best[1][index]
        verdict = "meets" if ratio >= 1.6 else "misses"
        print(f"--workers 2 / --workers 1, {what}: {ratio:.2f}x ({verdict} the 1.6x target)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("ACKGATE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--hash-us", type=float, default=20.0, help="µs of hashing per message")
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(bench(args.bootstrap, args.messages, args.repeat, args.hash_us))
        return
    sys.path.insert(0, str(TEST_SUPPORT))
    from ackgate_test_support.kafka_broker import LocalKafkaBroker

    with (
        tempfile.TemporaryDirectory() as workdir,
        LocalKafkaBroker(Path(workdir), java_opts=("-Xms512m", "-Xmx1g")) as broker,
    ):
        asyncio.run(bench(broker.bootstrap, args.messages, args.repeat, args.hash_us))


if __name__ == "__main__":
    main()
