"""The ``ackgate`` command: ``ackgate demo`` runs the whole pipeline on the embedded broker.

The demo publishes JSON events (about 1 % torn mid-record) into a
:class:`~ackgate.adapters.memory.MemoryBroker` and reads them through one shared
stream: the *indexer* stores valid events in SQLite through the runner's sink
(bind, store, confirm), the *auditor* rejects malformed ones (``<topic>.dlq``), the
*notifier* feeds a slow downstream. Once the group has committed past every event
it checks the books. Exit 0 when they balance, 1 when not, 2 for bad options.
Progress bars need ``rich`` (the ``cli`` extra); ``--json`` needs nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _handler_list(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in HANDLERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"pick from {','.join(HANDLERS)} (comma-separated), got {text!r}"
        )
    return names


DEMO_DESCRIPTION = """\
Publish events (about 1 % malformed) into the embedded broker and read them through
one shared stream: the indexer stores valid events in SQLite, the auditor rejects
malformed ones (they go to the dead-letter topic), the notifier is slow. The broker
is committed past an event only when every handler is done with it. Exit 0 when the
books balance, 1 when they do not, 2 for bad options."""


def _parser() -> _Parser:
    parser = _Parser(prog="ackgate", description="ackgate's command line.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the embedded-broker demo and check the books",
        description=DEMO_DESCRIPTION,
    )
    demo.add_argument(
        "--events",
        type=_positive,
        default=10_000,
        metavar="N",
        help="events to publish (default: %(default)s)",
    )
    demo.add_argument(
        "--partitions",
        type=_positive,
        default=4,
        metavar="P",
        help="partitions of the topic (default: %(default)s)",
    )
    demo.add_argument(
        "--handlers",
        type=_handler_list,
        default=HANDLERS,
        metavar="LIST",
        help="comma-separated subset of indexer,auditor,notifier (default: all)",
    )
    demo.add_argument(
        "--crash-at",
        type=_positive,
        metavar="N",
        help="the notifier crashes once, on its N-th event, and re-subscribes",
    )
    demo.add_argument("--json", action="store_true", help="print the summary as JSON, no bars")
    demo.add_argument(
        "--seed", type=int, default=1, help="seed of the generated events (default: %(default)s)"
    )
    demo.add_argument(
        "--db",
        type=Path,
        metavar="PATH",
        help="SQLite file for the indexer (default: a temporary one)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    opts = parser.parse_args(argv)
    if opts.crash_at is not None:
        if "notifier" not in opts.handlers:
            parser.error("--crash-at needs the notifier among --handlers")
        if opts.crash_at > opts.events:
            parser.error(f"--crash-at {opts.crash_at} is beyond --events {opts.events}")
    if opts.json:
        display: _Display = _Display()
    else:
        try:
            display = _RichDisplay(opts.handlers)
        except ImportError:
            print(
                "ackgate demo: the progress display needs rich: "
                "pip install 'ackgate[cli]' (or use --json)",
                file=sys.stderr,
            )
            return 1
    with tempfile.TemporaryDirectory(prefix="ackgate-demo-") as scratch:
        db = opts.db if opts.db is not None else Path(scratch) / "index.sqlite3"
        demo = _Demo(opts.events, opts.partitions, opts.handlers, opts.crash_at, opts.seed, db)
        try:
            summary = asyncio.run(demo.run(display))
        except KeyboardInterrupt:
            display.abort()
            print("ackgate demo: interrupted", file=sys.stderr)
            return 130
    display.finish(summary)
    if opts.json:
        print(json.dumps(summary, indent=2))
    for problem in summary["discrepancies"]:
        print(f"ackgate demo: books do not balance: {problem}", file=sys.stderr)
    return 0 if summary["balanced"] else 1


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


class _Store:
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


class _Demo:
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
        self.store = _Store(db)
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
        notifier was the only handler and crashed)."""
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
                await manager.run_subscriber(KEY, name, handle, producer=self.producer, sink=sink)
            except _CrashRequested as crash:
                self.crashes += 1
                self._note(
                    f"{crash}; re-subscribing: the events it had not finished are redelivered"
                )
            else:
                return

    async def run(self, display: _Display) -> dict[str, Any]:
        self.publish()
        self._note = display.note
        await self.store.open()
        problems: list[str] = []
        started = time.perf_counter()
        try:
            # "block": the slow notifier holds the poll back instead of being
            # force-failed; the grace period lets every handler join before the
            # first event is broadcast, so each event's snapshot holds all of them.
            async with SharedStreamManager(
                overflow="block", subscriber_queue_size=2048, cohort_grace_period=0.05
            ) as manager:
                tasks = [
                    asyncio.create_task(self._supervise(manager, name), name=name)
                    for name in self.handlers
                ]
                problems += await self._wait_until_drained(tasks, display)
                elapsed = time.perf_counter() - started
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
        display.update(self)
        problems += self._check_books(ids)
        return self._summary(elapsed, len(ids), duplicates, problems)

    async def _wait_until_drained(
        self, tasks: list[asyncio.Task[None]], display: _Display
    ) -> list[str]:
        drained = asyncio.create_task(self.broker.wait_drained(TOPIC, GROUP))
        progress, progress_at = -1, time.monotonic()
        try:
            while not drained.done():
                await asyncio.wait(
                    [drained, *tasks], timeout=REFRESH_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
                display.update(self)
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


class _Display:
    """No output while running (``--json``)."""

    def note(self, message: str) -> None:
        pass

    def update(self, demo: _Demo) -> None:
        pass

    def finish(self, summary: dict[str, Any]) -> None:
        pass

    def abort(self) -> None:
        pass


class _RichDisplay(_Display):
    """Live progress bars, then the summary table. Imports rich here, so the rest of
    ackgate never needs it; ImportError means the ``cli`` extra is missing."""

    def __init__(self, handlers: Sequence[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._console = Console()
        self._progress = Progress(
            TextColumn("{task.description:>22}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=self._console,
        )
        self._bars: dict[str, Any] = {}
        self._handlers = handlers

    def note(self, message: str) -> None:
        self._progress.console.print(f"[yellow]{message}[/]")

    def update(self, demo: _Demo) -> None:
        if not self._bars:
            self._progress.start()
            rows = {"broadcast": "broadcast", "advanced": "advanced (committed)"}
            rows.update({name: f"{name} handled" for name in self._handlers})
            self._bars = {
                key: self._progress.add_task(label, total=demo.events)
                for key, label in rows.items()
            }
        stats = demo.stats()
        done = {"broadcast": stats.delivered, "advanced": demo.committed_total(), **demo.handled}
        for key, completed in done.items():
            # Redeliveries can take a count past the number of events.
            self._progress.update(
                self._bars[key], completed=completed, total=max(demo.events, completed)
            )

    def abort(self) -> None:
        self._progress.stop()

    def finish(self, summary: dict[str, Any]) -> None:
        from rich.table import Table

        self._progress.stop()
        table = Table(title="ackgate demo", show_header=False)
        table.add_column(justify="right", style="bold")
        table.add_column()
        offsets = "  ".join(
            f"p{p}={o}/{summary['end_offsets'][p]}" for p, o in summary["committed_offsets"].items()
        )
        rows = [
            ("events", f"{summary['events']} ({summary['malformed']} malformed)"),
            ("delivered", f"{summary['delivered']} ({summary['redelivered']} redelivered)"),
            (
                "handler resolutions",
                f"{summary['acked']} acked, {summary['failed']} failed,"
                f" {summary['rejected']} rejected",
            ),
            ("acked by all handlers", str(summary["committed_events"])),
            ("DLQ size", str(summary["dlq_size"])),
            ("holds (seek-backs)", str(summary["holds"])),
            (
                "indexer rows",
                f"{summary['indexer_rows']} ({summary['duplicates_absorbed']} duplicates absorbed)",
            ),
            ("notifier crashes", str(summary["notifier_crashes"])),
            ("elapsed", f"{summary['elapsed_seconds']:.2f} s"),
            ("throughput", f"{summary['throughput_events_per_second']} events/s"),
            ("committed offsets", offsets),
        ]
        for label, value in rows:
            table.add_row(label, value)
        self._console.print(table)
        if summary["balanced"]:
            indexed = summary["indexer_rows"]
            self._console.print(
                f"[green]Books balance: {summary['events']} committed"
                f" ({summary['dlq_size']} dead-lettered)"
                + ("" if indexed is None else f"; {indexed} indexed exactly once")
                + ".[/]"
            )
        else:
            for problem in summary["discrepancies"]:
                self._console.print(f"[red]Discrepancy: {problem}[/]")
