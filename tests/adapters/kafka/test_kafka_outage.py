"""docs/failure-semantics.md#broker-outages on genuine Kafka: the broker SIGKILLed for a while and
started again on the same storage and port, twice, in the middle of a run of a three-handler Service
under ``ackgate run``. The service must ride out both outages by itself.

The broker is the test's own (``LocalKafkaBroker``: it is killed, so it cannot be the
session's). The consumer is ``ackgate run outage_service:service`` in a subprocess.
Checked: every message is handled by all three handlers and committed at the end;
whenever the broker answers, nothing is committed that a handler has not finished;
the consumer process never exits; each outage is logged by ackgate exactly once at
WARNING (while the broker is down) and once at INFO (once it is back), recovery
(the INFO, and commits moving again) comes within 30 s of the broker's return, and
aiokafka's per-retry errors are rate-limited to a few lines.

Full size by default: 10,000 messages and 10 s outages (about a minute).
``ACKGATE_OUTAGE_SECONDS`` and ``ACKGATE_OUTAGE_MESSAGES`` change them for a longer
run by hand.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from aiokafka.errors import KafkaError

from ackgate.testing._local import LocalKafkaBroker

from .kafka_testlib import KafkaTestCluster

HERE = Path(__file__).parent
PARTITIONS = 4
COUNT = int(os.environ.get("ACKGATE_OUTAGE_MESSAGES", "10000"))
DOWN_SECONDS = float(os.environ.get("ACKGATE_OUTAGE_SECONDS", "10"))
OUTAGES_AT = (0.2, 0.55)  # fractions of the messages indexed when the broker is killed
RECOVERY_LIMIT = 30.0
LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>[\w.]+): (?P<message>.*)$")


def handled(workdir: Path, handler: str) -> Counter[tuple[int, int]]:
    path = workdir / f"{handler}.log"
    if not path.exists():
        return Counter()
    lines = path.read_text().splitlines()
    return Counter((int(p), int(o)) for p, o in (line.split() for line in lines if line))


def finished_by_all(workdir: Path) -> set[tuple[int, int]]:
    sets = [set(handled(workdir, h)) for h in ("indexer", "auditor", "notifier")]
    return sets[0] & sets[1] & sets[2]


def unfinished_below_commit(committed: dict[object, int], workdir: Path) -> list[str]:
    done = finished_by_all(workdir)
    return [
        f"{tp.partition}@{offset}"  # type: ignore[attr-defined]
        for tp, end in committed.items()
        for offset in range(end)
        if (tp.partition, offset) not in done  # type: ignore[attr-defined]
    ][:10]


def log_lines(path: Path) -> list[tuple[str, str, str]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if match:
            found.append((match["level"], match["logger"], match["message"]))
    return found


def outage_lines(path: Path, level: str) -> list[str]:
    return [m for lv, name, m in log_lines(path) if lv == level and name == "ackgate.upstream"]


async def committed_now(kafka: KafkaTestCluster, group: str) -> dict[object, int] | None:
    """The group's committed offsets, or ``None`` while the coordinator is not ready."""
    try:
        async with asyncio.timeout(10):
            return dict(await kafka.committed(group))
    except (KafkaError, TimeoutError):
        return None


async def until(predicate: object, seconds: float, what: str) -> float:
    """Poll ``predicate`` (sync or async) every 0.1 s; return the seconds it took.

    Another process writes what is checked (log files, the broker): nothing to await.
    """
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        result = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} (waited {seconds:g}s)")


def start_service(env: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    """``ackgate run outage_service:service``, its log lines going to ``output``."""
    with output.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "ackgate", "run", "outage_service:service"],
            cwd=HERE,
            env=env,
            stdout=err,
            stderr=subprocess.STDOUT,
        )


async def test_service_rides_out_two_broker_outages(tmp_path: Path) -> None:
    (tmp_path / "broker").mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    stderr = tmp_path / "ackgate-run.log"
    broker = LocalKafkaBroker(tmp_path / "broker")
    # Its start waits for the broker with a loop of its own: run it in a thread.
    await asyncio.to_thread(broker.start)
    try:
        kafka = KafkaTestCluster(broker.bootstrap)
        topic, group = kafka.unique("outage"), kafka.unique("g")
        await kafka.create_topic(topic, PARTITIONS)
        await kafka.produce(topic, COUNT, PARTITIONS)
        env = {
            **os.environ,
            "OUTAGE_BOOTSTRAP": broker.bootstrap,
            "OUTAGE_TOPIC": topic,
            "OUTAGE_GROUP": group,
            "OUTAGE_WORKDIR": str(workdir),
            "OUTAGE_WORK_SECONDS": "0.002",
        }
        process = start_service(env, stderr)
        recoveries = []
        try:
            for number, fraction in enumerate(OUTAGES_AT, start=1):

                async def far_enough(fraction: float = fraction) -> bool:
                    assert process.poll() is None, stderr.read_text()[-3000:]
                    committed = await committed_now(kafka, group)
                    if committed is None:
                        return False
                    assert unfinished_below_commit(committed, workdir) == []
                    return len(handled(workdir, "indexer")) >= fraction * COUNT and any(
                        committed.values()
                    )

                await until(far_enough, 120, f"{fraction:.0%} of the messages indexed")
                before = await committed_now(kafka, group)
                assert before is not None
                broker.kill()
                # The outage is noticed while the broker is down, and said once.
                await until(
                    lambda number=number: len(outage_lines(stderr, "WARNING")) == number,
                    DOWN_SECONDS + 10,
                    f"outage {number}: no 'Upstream lost' WARNING",
                )
                await asyncio.sleep(DOWN_SECONDS)  # the outage itself, not a synchronisation
                assert process.poll() is None, "ackgate run exited during the outage"
                # Same storage and port; returns once it answers.
                await asyncio.to_thread(broker.start)
                back = await until(
                    lambda number=number: len(outage_lines(stderr, "INFO")) == number,
                    RECOVERY_LIMIT,
                    f"outage {number}: no 'Upstream back' INFO within {RECOVERY_LIMIT}s",
                )

                async def moving(before: dict[object, int] = before) -> bool:
                    committed = await committed_now(kafka, group)
                    if committed is None:
                        return False
                    assert unfinished_below_commit(committed, workdir) == []
                    return sum(committed.values()) > sum(before.values())

                moved = await until(moving, RECOVERY_LIMIT, "commits do not move again")
                recoveries.append((back, back + moved))

            ends = await asyncio.wait_for(
                kafka.wait_committed_to_end(group, topic, PARTITIONS), 120
            )
            assert process.poll() is None, "ackgate run exited"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finally:
        await asyncio.to_thread(broker.stop)

    everything = {(n % PARTITIONS, n // PARTITIONS) for n in range(COUNT)}
    assert sum(ends.values()) == COUNT
    for handler in ("indexer", "auditor", "notifier"):
        assert set(handled(workdir, handler)) == everything, handler
    lines = log_lines(stderr)
    warnings = outage_lines(stderr, "WARNING")
    infos = outage_lines(stderr, "INFO")
    assert len(warnings) == 2 and len(infos) == 2, (warnings, infos)
    for warning in warnings:
        assert broker.bootstrap in warning and "Connect call failed" in warning, warning
    aiokafka = [line for line in lines if line[1].startswith("aiokafka") and line[0] == "ERROR"]
    suppressed = sum(
        int(m.group(1))
        for _, _, message in aiokafka
        if (m := re.search(r"\((\d+) similar lines suppressed", message))
    )
    ackgate_warnings = [
        m for lv, name, m in lines if lv == "WARNING" and name.startswith("ackgate")
    ]
    print(
        f"\n{COUNT} messages, two {DOWN_SECONDS:g}s outages; recovery (INFO, commits moving) "
        f"{[(round(a, 1), round(b, 1)) for a, b in recoveries]}s after the broker answered; "
        f"aiokafka ERROR lines shown {len(aiokafka)}, suppressed {suppressed}; "
    )
    assert ackgate_warnings == warnings  # exactly one WARNING from ackgate per outage
    # Without the rate limit: dozens a second for the whole outage.
    assert len(aiokafka) <= 40 and suppressed >= 10 * len(aiokafka), aiokafka
