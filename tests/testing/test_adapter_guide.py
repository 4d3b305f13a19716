"""docs/writing-an-adapter.md's toy adapter passes the conformance kit as written, and
the kit catches it once it commits a failed message instead of redelivering it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .brokers_cli import clean_env

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-an-adapter.md"
REWIND = "self.generation[lane] = generation + 1"


def _run_guide(tmp_path: Path, broken: bool) -> subprocess.CompletedProcess[str]:
    producer, suite = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)[:2]
    assert REWIND in producer
    if broken:  # "failed" treated like "clean": the broker never sees it again
        producer = producer.replace(REWIND, "self.broker.committed[lane] = offset + 1  #")
        suite += "\nToyHarness.timeout = 3.0  # the redelivery it waits for never comes\n"
    (tmp_path / "toy_broker.py").write_text(producer)
    (tmp_path / "test_toy_conformance.py").write_text(suite)
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)),
            *("-q", "-p", "no:asyncio", "test_toy_conformance.py"),
        ],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_guides_toy_adapter_passes_the_kit(tmp_path: Path) -> None:
    result = _run_guide(tmp_path, broken=False)
    assert "6 passed" in result.stdout, result.stdout + result.stderr


def test_the_kit_fails_a_toy_that_commits_failed_messages(tmp_path: Path) -> None:
    result = _run_guide(tmp_path, broken=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED test_toy_conformance.py::TestToyAdapter::test_failed_is_redelivered" in (
        result.stdout
    ), result.stdout
