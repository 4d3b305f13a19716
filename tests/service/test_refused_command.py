"""``ackgate run`` and a broker that refuses the service (docs/production.md#security):
exit 1 with one ERROR line naming the refusal; with ``--retry-on-auth-error`` the
service keeps retrying, the refusal is logged once and ``/readyz`` says why."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

APP = """
from ackgate import AuthenticationFailed, Service, SharedStreamProducer


class Refused(SharedStreamProducer):
    async def open_stream(self):
        raise AuthenticationFailed("authentication failed for user alice (SCRAM-SHA-512)")
        yield

    def get_advance_lane(self, payload):
        return 0

    async def advance(self, batch):
        pass


service = Service("orders", producer=Refused)


@service.handler("h")
async def handle(message) -> None:
    pass
"""

REASON = "authentication failed for user alice (SCRAM-SHA-512)"


def start(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    (tmp_path / "refused_app.py").write_text(APP)
    return subprocess.Popen(
        [sys.executable, "-m", "ackgate", "run", "refused_app:service", *options],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_refusal_exits_1_naming_it(tmp_path: Path) -> None:
    child = start(tmp_path)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 1, err
    (line,) = [line for line in err.splitlines() if "ERROR" in line]
    assert f"service 'orders' failed: AuthenticationFailed: {REASON}" in line
    assert "the broker refused it, not retried" in line


def test_retry_on_auth_error_retries_and_readyz_says_why(tmp_path: Path) -> None:
    child = start(tmp_path, "--retry-on-auth-error", "0.05", "--health-port", "0")
    lines: list[str] = []
    try:
        assert child.stderr is not None
        port = None
        for line in child.stderr:
            lines.append(line)
            found = re.search(r"health endpoints .* port (\d+)", line)
            if found:
                port = int(found[1])
            if REASON in line:
                break
        assert port is not None, "".join(lines)
        reader = threading.Thread(target=lambda: lines.extend(child.stderr or ()), daemon=True)
        reader.start()
        reasons: set[str] = set()
        for _ in range(200):  # a group life is short: ask until a backoff is seen
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
            except urllib.error.HTTPError as error:
                body = json.loads(error.read())
                reasons.update(p["reason"] for p in body["not_ready"])
            if f"the broker refused the service: {REASON} (retrying)" in reasons:
                break
        assert f"the broker refused the service: {REASON} (retrying)" in reasons, reasons
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
        reader.join(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # Once at WARNING, however many retries (each group life's own INFO stop line says
    # why it stopped, as for any group).
    said = [line for line in lines if REASON in line and " INFO " not in line]
    assert len(said) == 1 and "retrying every 0.05s" in said[0], "".join(lines)
