"""The examples run as they are, as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_example(name: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / name)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart(tmp_path: Path) -> None:
    out = run_example("quickstart.py", tmp_path)
    assert 'dead-lettered: [b\'{"sku": "C3", "q\']' in out
    assert "committed offsets: {0: 1, 1: 3}" in out
    stored = next(line for line in out.splitlines() if line.startswith("stored:"))
    assert stored.count("'sku'") == 3


def test_low_level(tmp_path: Path) -> None:
    out = run_example("low_level.py", tmp_path)
    assert 'dead-lettered: [b\'{"sku": "C3", "q\']' in out
    assert "committed offsets: {0: 1, 1: 3}" in out
    stored = next(line for line in out.splitlines() if line.startswith("stored:"))
    assert stored.count("'sku'") == 3


def test_custom_producer(tmp_path: Path) -> None:
    out = run_example("custom_producer.py", tmp_path)
    assert "inbox: []" in out
    assert "done: ['eu/001.flag', 'eu/003.flag', 'us/001.flag', 'us/002.flag']" in out
    assert "rejected: ['eu/002.flag']" in out
    assert out.count("handled ") == 5


def test_readme_quickstart_is_the_example() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (REPO / "examples" / "quickstart.py").read_text()
