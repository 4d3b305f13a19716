"""docs/production.md#watching-it ``ackgate run --workers``: a worker that exits 2 (a bad target:
every restart would fail the same way) stops them all and the parent exits 2, instead of restarting
it forever. (Workers on a broker: tests/adapters/kafka/test_kafka_workers.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_bad_target_stops_every_worker_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ackgate", "run", "nosuchmodule:service", "--workers", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot import 'nosuchmodule'" in done.stderr
    assert "exited 2 (a bad target or option): stopping every worker" in done.stderr
    assert "starting it again" not in done.stderr
