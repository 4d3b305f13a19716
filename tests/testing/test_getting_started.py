"""The getting-started walk-through on Kafka, run verbatim: the commands of
docs/getting-started.md's second terminal (create a topic, produce, ``ackgate run`` the
example, wait until its group committed everything, stop it) as one bash script in
``tmp_path``, against the session's Kafka.

The walk-through names its topic ``orders``: against an address given in
``ACKGATE_KAFKA_BOOTSTRAP`` this runs once per broker (``topic create`` refuses an
existing topic).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from ackgate.testing.brokers import KafkaBroker

from .brokers_cli import clean_env

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
MARKER = "tests/testing/test_getting_started.py runs these commands verbatim"


def walk_through() -> str:
    """The bash block that follows the marker on the page."""
    after = PAGE.read_text().split(MARKER, 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    return block


async def dead_lettered(bootstrap: str) -> list[tuple[bytes, dict[str, bytes]]]:
    consumer = AIOKafkaConsumer(
        "orders.dlq", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 30)
        return [(record.value, dict(record.headers))]
    finally:
        await consumer.stop()


def test_the_kafka_walk_through_runs_as_written(ackgate_kafka: KafkaBroker, tmp_path: Path) -> None:
    script = walk_through()
    assert "ackgate run examples.kafka_service:service" in script
    (tmp_path / "walk.sh").write_text("set -euo pipefail\n" + script)
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "kafka_service.py", tmp_path / "examples")
    bin_dir = str(Path(sys.executable).parent)
    env = clean_env(
        ACKGATE_KAFKA_BOOTSTRAP=ackgate_kafka.bootstrap,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )
    result = subprocess.run(
        ["bash", "walk.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "group orders-service has committed everything on orders" in output
    assert output.count("notified orders/") == 3, output
    with sqlite3.connect(tmp_path / "index.db") as index:
        stored = sorted(body for (body,) in index.execute("SELECT body FROM orders"))
    assert stored == ['{"sku": "A1", "qty": 2}', '{"sku": "B7", "qty": 1}']
    ((body, headers),) = asyncio.run(dead_lettered(ackgate_kafka.bootstrap))
    assert body == b'{"sku": "C3", "q'
    assert b"auditor: malformed JSON" in headers["ackgate.reason"]
