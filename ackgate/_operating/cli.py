"""The ``ackgate`` command: ``ackgate demo`` runs the whole pipeline on the embedded broker,
``ackgate run MODULE:ATTR`` runs services (:mod:`ackgate._operating.run_command`),
``ackgate adapters`` lists the installed broker adapters, ``ackgate --version``.

For the demo this module is the command line around the run in :mod:`ackgate._operating.demo`:
it parses and checks the options, shows progress bars while the run goes and prints
its summary. Exit 0 when the books balance, 1 when not, 2 for bad options or a
missing ``rich``. Progress bars need ``rich`` (the ``cli`` extra); ``--json`` needs
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NoReturn

from ackgate._operating.args import int_at_least
from ackgate._operating.demo import HANDLERS, Demo
from ackgate._operating.dlq_command import add_parser as add_dlq_parser
from ackgate._operating.dlq_command import dlq_command
from ackgate._operating.run_command import add_parser as add_run_parser
from ackgate._operating.run_command import run_command
from ackgate._version import __version__

ADAPTER_GROUP = "ackgate.adapters"
"""The entry-point group every adapter distribution registers its producer class under."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _handler_list(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in HANDLERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"pick from {','.join(HANDLERS)} (comma-separated), got {text!r}"
        )
    return names


def _database_path(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a database file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {str(path.parent)!r} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"directory {str(path.parent)!r} is not writable")
    return path


DEMO_DESCRIPTION = """\
Publish events (about 1 % malformed) into the embedded broker and read them through
one shared stream: the indexer stores valid events in SQLite, the auditor rejects
malformed ones (they go to the dead-letter topic), the notifier is slow. The broker
is committed past an event only when every handler is done with it. Exit 0 when the
books balance, 1 when they do not, 2 for bad options."""


def _parser() -> _Parser:
    parser = _Parser(prog="ackgate", description="ackgate's command line.")
    parser.add_argument("--version", action="version", version=f"ackgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "adapters",
        help="list the installed broker adapters",
        description=(
            f"List the producers registered under the {ADAPTER_GROUP!r} entry-point group: "
            "name, distribution, version and object path, one per line. Reads package "
            "metadata only; no adapter or client library is imported."
        ),
    )
    demo = commands.add_parser(
        "demo",
        help="run the embedded-broker demo and check the books",
        description=DEMO_DESCRIPTION,
    )
    demo.add_argument(
        "--events",
        type=int_at_least(1),
        default=10_000,
        metavar="N",
        help="events to publish (default: %(default)s)",
    )
    demo.add_argument(
        "--partitions",
        type=int_at_least(1),
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
        type=int_at_least(1),
        metavar="N",
        help="the notifier crashes once, on its N-th event, and re-subscribes",
    )
    demo.add_argument("--json", action="store_true", help="print the summary as JSON, no bars")
    demo.add_argument(
        "--seed", type=int, default=1, help="seed of the generated events (default: %(default)s)"
    )
    demo.add_argument(
        "--db",
        type=_database_path,
        metavar="PATH",
        help="SQLite file for the indexer (default: a temporary one)",
    )
    add_run_parser(commands)
    add_dlq_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    opts = parser.parse_args(argv)
    opts.argv = list(sys.argv[1:] if argv is None else argv)  # --workers starts it again
    if opts.command == "adapters":
        for line in _adapter_lines():
            print(line)
        return 0
    if opts.command == "run":
        return run_command(opts)
    if opts.command == "dlq":
        return dlq_command(opts)
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
            return 2
    with tempfile.TemporaryDirectory(prefix="ackgate-demo-") as scratch:
        db = opts.db if opts.db is not None else Path(scratch) / "index.sqlite3"
        demo = Demo(opts.events, opts.partitions, opts.handlers, opts.crash_at, opts.seed, db)
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


def _adapter_lines() -> list[str]:
    """One aligned line per registered adapter, sorted by name, read from metadata only."""
    rows = []
    for entry in entry_points(group=ADAPTER_GROUP):
        assert entry.dist is not None  # set on every entry point found in installed metadata
        rows.append((entry.name, entry.dist.name, entry.dist.version, entry.value))
    rows.sort()
    name, dist, version = (max((len(row[i]) for row in rows), default=0) for i in range(3))
    return [f"{n:<{name}}  {d:<{dist}}  {v:<{version}}  {path}" for n, d, v, path in rows]


class _Display:
    """No output while running (``--json``)."""

    def note(self, message: str) -> None:
        pass

    def update(self, demo: Demo) -> None:
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

    def update(self, demo: Demo) -> None:
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
