"""docs/production.md#watching-it ``ackgate run --workers 2`` on genuine Kafka, 4 partitions: the
workers share the partitions through the consumer group; a worker killed with SIGKILL is started
again and nothing is lost; SIGTERM stops both gracefully, committing only what was handled; the
parent's ``/readyz`` answers for both."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from .kafka_testlib import KafkaTestCluster

PARTITIONS = 4
COMMAND = (sys.executable, "-m", "ackgate", "run", "app:service")

APP = """
import asyncio
import os

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer

log = os.open(os.environ["HANDLED"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

service = Service(
    "workers",
    producer=lambda: KafkaStreamProducer(
        os.environ["TOPIC"],
        bootstrap_servers=os.environ["BOOTSTRAP"],
        group_id=os.environ["GROUP"],
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    ),
    restart_backoff=0.2,
)


@service.handler("indexer", concurrency=4)
async def index(message: Message) -> None:
    await asyncio.sleep(0.002)
    os.write(log, b"%d %d %d\\n" % (message.raw.partition, message.raw.offset, os.getpid()))
"""


def handled(path: Path) -> dict[tuple[int, int], set[int]]:
    """``(partition, offset)`` -> pids of the workers that handled it."""
    seen: dict[tuple[int, int], set[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            partition, offset, pid = map(int, line.split())
            seen.setdefault((partition, offset), set()).add(pid)
    return seen


def readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class Parent:
    """``ackgate run --workers 2`` as a subprocess; its log lines, read as they come."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.process = subprocess.Popen(
            [*COMMAND, "--workers", "2", "--health-port", "0", "--shutdown-timeout", "20"],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60) -> list[re.Match[str]]:
        def found() -> list[re.Match[str]]:
            return [m for line in self.lines if (m := re.search(pattern, line))]

        with self.changed:
            if not self.changed.wait_for(lambda: len(found()) >= count, timeout=timeout):
                raise AssertionError(f"no {pattern!r} x{count} in:\n" + "".join(self.lines))
            return found()


async def until_handled_by_two_workers(
    path: Path, earlier: set[tuple[int, int]], parent: Parent
) -> None:
    """Until records not in ``earlier`` were handled by two worker processes."""
    async with asyncio.timeout(60):
        while True:  # another process writes it: poll
            new = [pids for record, pids in handled(path).items() if record not in earlier]
            if len(set().union(*new)) >= 2:
                return
            assert parent.process.poll() is None, "".join(parent.lines)
            await asyncio.sleep(0.05)


async def until_handled(path: Path, count: int, parent: Parent) -> None:
    async with asyncio.timeout(120):
        while len(handled(path)) < count:  # another process writes it: poll
            assert parent.process.poll() is None, "".join(parent.lines)
            await asyncio.sleep(0.05)


async def test_two_workers_restart_a_killed_one_and_stop_gracefully(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    topic, group = kafka.unique("workers"), kafka.unique("g")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.produce(topic, 3000, PARTITIONS)
    (tmp_path / "app.py").write_text(APP)
    log = tmp_path / "handled.log"
    env = dict(os.environ, BOOTSTRAP=kafka.bootstrap, TOPIC=topic, GROUP=group, HANDLED=str(log))
    parent = Parent(tmp_path, env)
    try:
        port = int(parent.wait_for(r"of 2 workers on port (\d+)")[0][1])
        started = parent.wait_for(r"worker (\d) started \(pid (\d+)\)", count=2)
        pids = {int(m[1]): int(m[2]) for m in started}
        await until_handled(log, 500, parent)

        os.kill(pids[0], signal.SIGKILL)
        restarted = parent.wait_for(r"worker 0 started \(pid (\d+)\)", count=2)[-1]
        assert int(restarted[1]) != pids[0]
        parent.wait_for(r"worker 0 .*exited with status -9; starting it again")
        async with asyncio.timeout(120):
            ends = await kafka.wait_committed_to_end(group, topic, PARTITIONS)
        seen = handled(log)
        assert {(tp.partition, o) for tp, end in ends.items() for o in range(end)} <= set(seen)
        async with asyncio.timeout(60):
            # Another process answers: nothing to await but its reply, so poll it.
            while (answer := await asyncio.to_thread(readyz, port))[0] != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert answer[1] == {"status": "ok", "workers": 2}

        # More work, and SIGTERM in the middle of it, once both workers handle some of
        # it: the consumer group shares the partitions out between the live workers
        # (one could take them all before the other joined, and finish the first
        # 3000 alone).
        before = len(seen)
        await kafka.produce(topic, 3000, PARTITIONS)
        await until_handled(log, before + 300, parent)
        await until_handled_by_two_workers(log, set(seen), parent)
        parent.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(parent.process.wait, 60) == 0, "".join(parent.lines)
        assert len(parent.wait_for(r"\[worker \d\].*stopping gracefully", count=2)) == 2
        committed = await kafka.committed(group)
        seen = handled(log)
        # Nothing committed that was not handled; the stop committed what was.
        assert {(tp.partition, o) for tp, end in committed.items() for o in range(end)} <= set(seen)
        assert sum(committed.values()) > sum(ends.values())
    finally:
        if parent.process.poll() is None:
            parent.process.kill()
            parent.process.wait()
