"""Issue 13 on genuine Kafka: ``examples/kafka_service.py`` run as
``ackgate run examples.kafka_service:service`` from the repository root.

About 50 records (a few not JSON) are published; the example runs as a subprocess until
the group's committed offsets reach the end of the topic, then gets SIGTERM. It must
exit 0 with every JSON record in its SQLite index and every malformed one in the DLQ,
carrying the auditor's reason in ``ackgate.reason``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from aiokafka import AIOKafkaProducer

from .kafka_testlib import KafkaTestCluster

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = 2
COUNT = 50
MALFORMED = {7, 19, 23, 41}


def body(n: int) -> bytes:
    return b"{not json %d" % n if n in MALFORMED else json.dumps({"n": n}).encode()


def ackgate_command() -> list[str]:
    script = shutil.which("ackgate", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "ackgate"]


def start_example(
    kafka: KafkaTestCluster, topic: str, group: str, dlq: str, db_path: Path, stderr: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ACKGATE_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "ACKGATE_KAFKA_TOPIC": topic,
        "ACKGATE_KAFKA_GROUP": group,
        "ACKGATE_KAFKA_DLQ_TOPIC": dlq,
        "ACKGATE_INDEX_DB": str(db_path),
    }
    env.pop("PYTHONPATH", None)  # the example must import from the cwd alone
    return subprocess.Popen(
        [*ackgate_command(), "run", "examples.kafka_service:service"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("wb"),
    )


async def test_example_service_indexes_valid_and_dead_letters_malformed(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group, dlq = kafka.unique("example"), kafka.unique("g"), kafka.unique("dlq")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.create_topic(dlq, 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    try:
        sent = [await producer.send(topic, body(n), partition=n % PARTITIONS) for n in range(COUNT)]
        ids = {
            n: f"{topic}/{md.partition}/{md.offset}"
            for n, md in enumerate(await asyncio.gather(*sent))
        }
    finally:
        await producer.stop()

    db_path = tmp_path / "index.db"
    stderr = tmp_path / "service.err"
    process = start_example(kafka, topic, group, dlq, db_path, stderr)
    try:
        async with asyncio.timeout(60):
            waiting = asyncio.create_task(kafka.wait_committed_to_end(group, topic, PARTITIONS))
            while not waiting.done():
                if process.poll() is not None:
                    waiting.cancel()
                    raise AssertionError(f"exited {process.returncode}: {stderr.read_text()}")
                await asyncio.sleep(0.1)
            await waiting
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    db = sqlite3.connect(db_path)
    try:
        rows = dict(db.execute("SELECT id, body FROM orders"))
    finally:
        db.close()
    assert rows == {ids[n]: json.dumps({"n": n}) for n in range(COUNT) if n not in MALFORMED}
    dead = await kafka.read_all(dlq, len(MALFORMED))
    assert sorted(record.value for record in dead) == sorted(body(n) for n in MALFORMED)
    for record in dead:
        headers = dict(record.headers)
        assert b"auditor: malformed JSON" in headers["ackgate.reason"]
        original = headers["ackgate.original.partition"], headers["ackgate.original.offset"]
        assert f"{topic}/{original[0].decode()}/{original[1].decode()}" in {
            ids[n] for n in MALFORMED
        }
