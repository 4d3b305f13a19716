"""What the documented commands leave in a checkout is ignored by git: ``mkdocs build``
writes ``site/``, the Kafka example and the demo's ``--db`` write an ``index.db``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
def test_build_outputs_are_ignored() -> None:
    paths = ["site/index.html", "index.db", "examples/index.db"]
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.split() == paths, result.stderr
