"""``ackgate demo`` end to end: in-process through ``main`` and as ``python -m ackgate``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ackgate._operating import cli as _cli
from ackgate._operating import demo as _demo

REPO = Path(__file__).resolve().parents[2]


def run_module(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def demo_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    status = _cli.main(["demo", "--json", *args])
    out, err = capsys.readouterr()
    return status, json.loads(out), err


def assert_balanced(summary: dict[str, Any]) -> None:
    assert summary["balanced"] is True, summary["discrepancies"]
    assert summary["committed_offsets"] == summary["end_offsets"]
    assert sum(summary["end_offsets"].values()) == summary["events"]
    assert summary["dlq_size"] == summary["malformed"] > 0
    assert summary["committed_events"] + summary["dlq_size"] == summary["events"]
    assert summary["indexer_rows"] == summary["events"] - summary["malformed"]


def test_default_handlers_balance_the_books(capsys: pytest.CaptureFixture[str]) -> None:
    status, summary, err = demo_json(capsys, "--events", "2000", "--seed", "3")
    assert (status, err) == (0, "")
    assert_balanced(summary)
    assert summary["handlers"] == ["indexer", "auditor", "notifier"]
    assert summary["rejected"] == summary["malformed"]
    assert summary["failed"] == summary["redelivered"] == 0


def test_a_clean_run_logs_no_warning(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The docs promise that a clean stop logs no WARNING (the handlers leaving at
    the end are no incident)."""
    status, summary, _ = demo_json(capsys, "--events", "500")
    assert status == 0
    assert_balanced(summary)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


def test_crash_at_redelivers_and_still_balances(capsys: pytest.CaptureFixture[str]) -> None:
    status, summary, _ = demo_json(capsys, "--events", "2000", "--crash-at", "700")
    assert status == 0
    assert_balanced(summary)
    assert summary["notifier_crashes"] == 1
    assert summary["failed"] >= 1 and summary["holds"] >= 1
    assert summary["redelivered"] >= 1
    assert summary["delivered"] == summary["events"] + summary["redelivered"]
    assert summary["handled"]["notifier"] > 700


def test_crash_of_the_only_handler_restarts_the_group(capsys: pytest.CaptureFixture[str]) -> None:
    status, summary, _ = demo_json(
        capsys, "--events", "300", "--handlers", "notifier", "--crash-at", "5"
    )
    assert status == 0, summary["discrepancies"]
    assert summary["notifier_crashes"] == 1
    assert summary["redelivered"] >= 1
    assert summary["dlq_size"] == 0  # no auditor: malformed events are simply committed
    assert summary["indexer_rows"] is None


def test_db_option_keeps_the_index(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite3"
    status, summary, _ = demo_json(
        capsys, "--events", "400", "--handlers", "indexer,auditor", "--db", str(db)
    )
    assert status == 0
    with sqlite3.connect(db) as conn:
        [(rows, deliveries)] = conn.execute("SELECT COUNT(*), SUM(deliveries) FROM events")
    assert rows == summary["indexer_rows"] == 400 - summary["malformed"]
    assert deliveries == rows


def test_a_lost_row_unbalances_the_books(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    put = _demo.Store._put

    def lossy(self: _demo.Store, row: tuple[int, str, int]) -> None:
        if row[0] % 100 != 7:
            put(self, row)

    monkeypatch.setattr(_demo.Store, "_put", lossy)
    status, summary, err = demo_json(capsys, "--events", "300", "--handlers", "indexer")
    assert status == 1
    assert summary["balanced"] is False
    assert "valid events are missing from the index" in err
    assert len(err.strip().splitlines()) == len(summary["discrepancies"]) == 1


def test_a_stalled_run_gives_up_with_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(self: _demo.Demo, user: str) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(_demo, "STALL_SECONDS", 0.5)
    monkeypatch.setattr(_demo.Demo, "send", never)
    status, summary, err = demo_json(capsys, "--events", "300")
    assert status == 1
    assert any("no commit" in problem for problem in summary["discrepancies"])
    assert "books do not balance" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--events", "0"], "--events: must be an int >= 1"),
        (["demo", "--events", "many"], "not an integer"),
        (["demo", "--handlers", "indexer,mailer"], "pick from indexer,auditor,notifier"),
        (["demo", "--handlers", "indexer", "--crash-at", "3"], "needs the notifier"),
        (["demo", "--events", "10", "--crash-at", "11"], "beyond --events 10"),
        (["demo", "--bogus"], "unrecognized arguments"),
        (["demo", "--db", "/nonexistent-ackgate-dir/index.sqlite3"], "does not exist"),
        (["demo", "--db", "."], "is a directory"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1
    assert message in err and err.startswith("ackgate")


def test_python_m_ackgate_demo_json(tmp_path: Path) -> None:
    done = run_module("-m", "ackgate", "demo", "--events", "2000", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_balanced(json.loads(done.stdout))
    assert list(tmp_path.iterdir()) == []  # the default database is temporary


def test_python_m_ackgate_demo_with_progress_and_crash(tmp_path: Path) -> None:
    done = run_module(
        "-m", "ackgate", "demo", "--events", "1000", "--crash-at", "200", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "notifier crashed on its event 200" in done.stdout
    assert "committed offsets" in done.stdout
    assert "Books balance: 1000 committed" in done.stdout


def test_bad_option_as_a_subprocess(tmp_path: Path) -> None:
    done = run_module("-m", "ackgate", "demo", "--partitions", "-1", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--partitions" in done.stderr


def test_json_needs_no_rich_and_bars_name_the_extra(tmp_path: Path) -> None:
    without_rich = (
        "import sys; sys.modules['rich'] = None; from ackgate._operating.cli import main; "
    )
    done = run_module(
        "-c", without_rich + "sys.exit(main(['demo', '--events', '200', '--json']))", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["balanced"] is True
    done = run_module(
        "-c", without_rich + "sys.exit(main(['demo', '--events', '200']))", cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "pip install 'ackgate[cli]'" in done.stderr
