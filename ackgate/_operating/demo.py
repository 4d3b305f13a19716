"""The ``ackgate demo`` run: the whole pipeline on the embedded broker, then the books.

The run publishes JSON events (about 1 % torn mid-record) into a
:class:`~ackgate.adapters.memory.MemoryBroker` and reads them through one shared
stream: the *indexer* stores valid events in SQLite through the runner's sink
(bind, store, confirm), the *auditor* rejects malformed ones (``<topic>.dlq``), the
*notifier* feeds a slow downstream. Once the group has committed past every event
it checks the books and returns a summary. Rendering it is the command line's job
(:mod:`ackgate._operating.cli`), so nothing here prints or needs ``rich``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from ackgate import SharedStreamManager, StreamTerminated, reject_shared_stream_event
from ackgate.adapters.memory import (
    MemoryBroker,
    MemoryProducerStats,
    MemoryStreamProducer,
    Position,
)

HANDLERS = ("indexer", "auditor", "notifier")
TOPIC = "demo.events"
GROUP = "ackgate-demo"
KEY = "demo"
MALFORMED_RATE = 0.01
# The notifier's downstream answers a burst of NOTIFY_BURST notifications per NOTIFY_PAUSE.
NOTIFY_BURST = 20
NOTIFY_PAUSE = 0.003
STALL_SECONDS = 30.0
REFRESH_SECONDS = 0.1


class ProgressListener(Protocol):
    """Who watches a run while it goes: the command line's display, or nobody (``--json``)."""

    def note(self, message: str) -> None:
        """An event worth telling the user about, such as the notifier's scripted crash."""

    def update(self, demo: Demo) -> None:
        """Called about every ``REFRESH_SECONDS`` and once at the end; reads ``demo``'s counters."""


def _parse(raw: bytes) -> tuple[int, str, int] | None:
    """``(id, user, amount)`` of a well-formed event, ``None`` for a malformed one."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    match doc:
        case {"id": int(event_id), "user": str(user), "amount": int(amount)}:
            return event_id, user, amount
    return None


class _CrashRequested(Exception):
    """The notifier's scripted crash (``--crash-at``)."""


class Store:
    """The indexer's SQLite table. One worker thread owns the connection, so the loop
    never waits on disk and sqlite3's same-thread rule holds."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ackgate-demo-db")
        self._conn: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def open(self) -> None:
        await self._call(self._open)

    async def put(self, row: tuple[int, str, int]) -> None:
        await self._call(self._put, row)

    async def contents(self) -> tuple[set[int], int]:
        """The stored ids and the number of duplicate deliveries the upsert absorbed."""
        result: tuple[set[int], int] = await self._call(self._contents)
        return result

    async def close(self) -> None:
        if self._conn is not None:
            await self._call(self._conn.close)
        self._pool.shutdown()

    def _open(self) -> None:
        self._conn = sqlite3.connect(self._path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # WAL with synchronous=NORMAL: durable against a crash of this process, which is
        # the failure the demo plays with; it skips an fsync per row.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("DROP TABLE IF EXISTS events")
        self._conn.execute(
            "CREATE TABLE events (id INTEGER PRIMARY KEY, user TEXT NOT NULL,"
            " amount INTEGER NOT NULL, deliveries INTEGER NOT NULL)"
        )

    def _put(self, row: tuple[int, str, int]) -> None:
        assert self._conn is not None
        # The primary key makes redelivery idempotent: a duplicate only bumps a counter.
        self._conn.execute(
            "INSERT INTO events VALUES (?, ?, ?, 1) ON CONFLICT(id)"
            " DO UPDATE SET deliveries = deliveries + 1",
            row,
        )

    def _contents(self) -> tuple[set[int], int]:
        assert self._conn is not None
        ids = {row[0] for row in self._conn.execute("SELECT id FROM events")}
        [(extra,)] = self._conn.execute("SELECT COALESCE(SUM(deliveries - 1), 0) FROM events")
        return ids, int(extra)


class Demo:
    """One run: the broker, the handlers, their counters and the books."""

    def __init__(
        self,
        events: int,
        partitions: int,
        handlers: Sequence[str],
        crash_at: int | None,
        seed: int,
        db: Path,
    ) -> None:
        self.events = events
        self.partitions = partitions
        self.handlers = tuple(handlers)
        self.crash_at = crash_at
        self.seed = seed
        self.broker = MemoryBroker()
        self.store = Store(db)
        self.handled = dict.fromkeys(self.handlers, 0)
        self.crashes = 0
        self.notified = 0
        # What the books are checked against, filled by publish().
        self.malformed: set[Position] = set()
        self.valid_ids: set[int] = set()
        self._producers: list[MemoryStreamProducer] = []
        self._note: Callable[[str], None] = lambda _: None

    def publish(self) -> None:
        rng = random.Random(self.seed)
        self.broker.create_topic(TOPIC, self.partitions)
        for n in range(self.events):
            user = f"user-{rng.randrange(1000)}"
            body = json.dumps({"id": n, "user": user, "amount": rng.randrange(1, 10_000)}).encode()
            malformed = rng.random() < MALFORMED_RATE
            if malformed:
                body = body[: len(body) // 2]  # torn mid-record
            position = self.broker.publish(TOPIC, body, key=user)
            if malformed:
                self.malformed.add(position)
            else:
                self.valid_ids.add(n)

    def producer(self) -> MemoryStreamProducer:
        producer = MemoryStreamProducer(self.broker, TOPIC, GROUP)
        self._producers.append(producer)
        return producer

    def stats(self) -> MemoryProducerStats:
        """Counters summed over every producer (one per group; a group restarts if the
        notifier was the only handler and crashed: its roster is then empty)."""
        totals = dict.fromkeys(MemoryProducerStats.__dataclass_fields__, 0)
        for producer in self._producers:
            for name in totals:
                totals[name] += getattr(producer.stats, name)
        return MemoryProducerStats(**totals)

    def committed_total(self) -> int:
        return sum(self.broker.committed(TOPIC, GROUP).values())

    async def index(self, events: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, str, int]]:
        async for raw in events:
            self.handled["indexer"] += 1
            row = _parse(raw)
            if row is not None:
                yield row  # the runner binds it, awaits the sink (SQLite), then confirms

    async def audit(self, events: AsyncIterator[bytes]) -> AsyncIterator[None]:
        async for raw in events:
            self.handled["auditor"] += 1
            if _parse(raw) is None:
                reject_shared_stream_event()
                continue
            yield None  # nothing to persist: the event passed the audit

    async def notify(self, events: AsyncIterator[bytes]) -> AsyncIterator[str]:
        async for raw in events:
            self.handled["notifier"] += 1
            if self.crashes == 0 and self.handled["notifier"] == self.crash_at:
                raise _CrashRequested(f"notifier crashed on its event {self.crash_at}")
            row = _parse(raw)
            if row is not None:
                yield row[1]

    async def send(self, user: str) -> None:
        self.notified += 1
        if self.notified % NOTIFY_BURST == 0:
            await asyncio.sleep(NOTIFY_PAUSE)  # the slow downstream

    async def _supervise(self, manager: SharedStreamManager, name: str) -> None:
        handles: dict[str, Callable[[AsyncIterator[bytes]], AsyncIterator[Any]]] = {
            "indexer": self.index,
            "auditor": self.audit,
            "notifier": self.notify,
        }
        sinks: dict[str, Callable[[Any], Awaitable[None]]] = {
            "indexer": self.store.put,
            "notifier": self.send,
        }
        handle, sink = handles[name], sinks.get(name)
        while True:
            try:
                await manager.run_subscriber(
                    KEY, name, handle, producer=self.producer, sink=sink, roster=self.handlers
                )
            except _CrashRequested as crash:
                self.crashes += 1
                self._note(
                    f"{crash}; re-subscribing: the events it had not finished are redelivered"
                )
            else:
                return

    async def run(self, listener: ProgressListener) -> dict[str, Any]:
        """Publish, run every handler until the group has committed past every event
        (or a handler stops, or commits stall), then check the books; return the summary."""
        self.publish()
        self._note = listener.note
        await self.store.open()
        problems: list[str] = []
        started = time.perf_counter()
        try:
            # The handlers are the group's roster: polling starts once all of them
            # are subscribed, the slow notifier holds the poll back instead of being
            # force-failed, and while the crashed notifier is away the group pauses,
            # so no event is ever committed without every handler.
            async with SharedStreamManager() as manager:
                tasks = [
                    asyncio.create_task(self._supervise(manager, name), name=name)
                    for name in self.handlers
                ]
                problems += await self._wait_until_drained(tasks, listener)
                elapsed = time.perf_counter() - started
                # Closing the manager first ends the group, so the handlers leave a
                # stopped group: cancelling them while it runs would read as crashes and
                # log a "paused" WARNING on a clean run. A handler stuck after a stall
                # is cancelled.
                await manager.aclose()
                for task in tasks:
                    task.cancel()
                for task, outcome in zip(
                    tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True
                ):
                    if isinstance(outcome, Exception) and not isinstance(outcome, StreamTerminated):
                        problems.append(f"handler {task.get_name()} failed: {outcome!r}")
            ids, duplicates = await self.store.contents()
        finally:
            await self.store.close()
        listener.update(self)
        problems += self._check_books(ids)
        return self._summary(elapsed, len(ids), duplicates, problems)

    async def _wait_until_drained(
        self, tasks: list[asyncio.Task[None]], listener: ProgressListener
    ) -> list[str]:
        drained = asyncio.create_task(self.broker.wait_drained(TOPIC, GROUP))
        progress, progress_at = -1, time.monotonic()
        try:
            while not drained.done():
                await asyncio.wait(
                    [drained, *tasks], timeout=REFRESH_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
                listener.update(self)
                if any(task.done() for task in tasks) and not drained.done():
                    return ["a handler stopped before every event was committed"]
                if self.committed_total() != progress:
                    progress, progress_at = self.committed_total(), time.monotonic()
                elif time.monotonic() - progress_at > STALL_SECONDS:
                    return [f"no commit for {STALL_SECONDS:.0f} s; gave up"]
            return []
        finally:
            drained.cancel()

    def _check_books(self, ids: set[int]) -> list[str]:
        problems = []
        committed = self.broker.committed(TOPIC, GROUP)
        for partition, end in self.broker.end_offsets(TOPIC).items():
            if committed[partition] != end:
                problems.append(
                    f"partition {partition}: committed offset {committed[partition]} of {end}"
                )
        origins = [record.origin for record in self.broker.records(TOPIC + ".dlq")]
        if len(set(origins)) != len(origins):
            problems.append(f"the DLQ holds {len(origins) - len(set(origins))} duplicates")
        expected = self.malformed if "auditor" in self.handlers else set()
        if missing := len(expected - set(origins)):
            problems.append(f"{missing} malformed events are missing from the DLQ")
        if extra := len(set(origins) - expected):
            problems.append(f"{extra} events are in the DLQ but should not be")
        if "indexer" in self.handlers:
            if unindexed := sorted(self.valid_ids - ids):
                problems.append(
                    f"{len(unindexed)} valid events are missing from the index,"
                    f" first ids {unindexed[:5]}"
                )
            if extra := len(ids - self.valid_ids):
                problems.append(f"the index holds {extra} events it should not")
        return problems

    def _summary(
        self, elapsed: float, rows: int, duplicates: int, problems: list[str]
    ) -> dict[str, Any]:
        stats = self.stats()
        committed = self.broker.committed(TOPIC, GROUP)
        return {
            "events": self.events,
            "malformed": len(self.malformed),
            "partitions": self.partitions,
            "handlers": list(self.handlers),
            "seed": self.seed,
            "delivered": stats.delivered,
            "redelivered": stats.redelivered,
            "acked": stats.acked,
            "failed": stats.failed,
            "rejected": stats.rejected,
            "committed_events": stats.committed,
            "dlq_size": len(self.broker.records(TOPIC + ".dlq")),
            "holds": stats.held,
            "handled": dict(self.handled),
            "notifier_crashes": self.crashes,
            "indexer_rows": rows if "indexer" in self.handlers else None,
            "duplicates_absorbed": duplicates,
            "elapsed_seconds": round(elapsed, 3),
            "throughput_events_per_second": round(self.events / elapsed) if elapsed else None,
            "committed_offsets": {str(p): o for p, o in committed.items()},
            "end_offsets": {str(p): o for p, o in self.broker.end_offsets(TOPIC).items()},
            "balanced": not problems,
            "discrepancies": problems,
        }
