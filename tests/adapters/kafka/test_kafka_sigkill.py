"""docs/failure-semantics.md#poison-messages on genuine Kafka, bounded: a three-handler Service
killed with SIGKILL while 1 % of messages fail for the broker once (held, then redelivered).

Runs ``benchmarks/kafka_sigkill.py`` at a small size (2,000 messages, 2 kills); the
full size (10,000 messages, 5 kills) is run by hand. Every handler must have handled
every message; the duplicate figures are printed (they depend on where the kills
land, so they are not asserted: test_kafka_attempts.py checks deterministically that
a restart does not replay what the last life finished).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .kafka_testlib import KafkaTestCluster

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "kafka_sigkill.py"
MESSAGES = 2_000


def test_sigkills_lose_nothing_and_duplicates_are_reported(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    command = [sys.executable, str(SCRIPT), "--bootstrap", kafka.bootstrap, "--json"]
    command += ["--messages", str(MESSAGES), "--kills", "2", "--max-outstanding", "200"]
    command += ["--workdir", str(tmp_path), "--timeout", "120"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    for sid in ("indexer", "auditor", "notifier"):
        assert figures[sid]["lost"] == 0, figures
        assert 0 <= figures[sid]["duplicates"] <= 2 * MESSAGES, figures
    print(f"\n{figures}")
