"""``ackgate dlq``: list a dead-letter destination's records grouped by handler and
reason, show one, replay chosen ones to their source or to one handler only
(docs/dead-letters.md).

The broker is reached through its adapter's ``ackgate.dead_letters`` entry point
(:mod:`ackgate._contract.dead_letters`); ackgate names no adapter here. A replay to
one handler carries ``ackgate.replay-to``: the service hands the copy to that handler
alone and its other handlers ack it unseen. Every replayed copy carries
``ackgate.replayed``: rejected again, it is dead-lettered once more with the count,
and ``replay`` leaves such records alone unless ``--again`` is given, so nothing
loops. Exit status: 0 done, 1 the broker failed, 2 a bad command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, TextIO

from ackgate._contract.dead_letters import DEAD_LETTER_GROUP, DeadLetter, DeadLetterBox

#: Characters of a reason shown in ``list``'s table.
_REASON_WIDTH = 90


class DlqUsage(Exception):
    """A bad ``ackgate dlq`` command line (exit 2)."""


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def add_parser(commands: Any) -> None:
    """``ackgate dlq list|show|replay BROKER DESTINATION``."""
    dlq = commands.add_parser(
        "dlq",
        help="list, show and replay a dead-letter destination's messages",
        description=__doc__.split("\n\n")[0].replace("\n", " ") if __doc__ else None,
    )
    actions = dlq.add_subparsers(dest="dlq_action", required=True, metavar="ACTION")
    for name, help_text in (
        ("list", "count the dead letters per handler and reason"),
        ("show", "print one dead letter: ids, reason, key, headers, body"),
        ("replay", "send chosen dead letters back, to every handler or to one"),
    ):
        action = actions.add_parser(name, help=help_text, description=help_text)
        action.add_argument("broker", help="the adapter's name: kafka, sqs, ...")
        action.add_argument("destination", help="the DLQ: a Kafka topic, an SQS queue URL...")
        action.add_argument(
            "-o",
            dest="options",
            type=_option,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a connection option of the adapter (bootstrap_servers=..., endpoint_url=...)",
        )
        if name == "list":
            action.add_argument("--json", action="store_true", help="print JSON")
        if name == "show":
            action.add_argument("id", help="the dead letter's id (as list --json shows)")
        if name == "replay":
            action.add_argument(
                "--id",
                dest="ids",
                action="append",
                default=[],
                metavar="ID",
                help="the dead letter of this id, or of this original id (repeatable)",
            )
            action.add_argument("--reason", metavar="TEXT", help="those whose reason has TEXT")
            action.add_argument("--handler", metavar="ID", help="those rejected by handler ID")
            action.add_argument("--all", action="store_true", help="every dead letter")
            action.add_argument(
                "--to-handler",
                metavar="ID",
                help="replay to handler ID only; the service's other handlers ack it unseen "
                "(default: to the source, every handler sees it again)",
            )
            action.add_argument(
                "--service",
                metavar="KEY",
                help="replay to the service of this key only: other services reading the "
                "source (other consumer groups, subscriptions) ack it unseen",
            )
            action.add_argument(
                "--again", action="store_true", help="also those that are replays already"
            )
            action.add_argument("--dry-run", action="store_true", help="say what, send nothing")


def dlq_command(opts: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``ackgate dlq``, printing to ``out`` (default: stdout); the exit status."""
    out = sys.stdout if out is None else out
    try:
        opener = _opener(opts.broker)
        if opts.dlq_action == "replay" and not (
            opts.ids or opts.reason or opts.handler or opts.all
        ):
            raise DlqUsage("replay: choose with --id, --reason, --handler, or --all")
        box = opener(opts.destination, dict(opts.options))
    except (DlqUsage, ValueError) as error:
        print(f"ackgate dlq: {error}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(box, opts, out))
    except DlqUsage as error:
        print(f"ackgate dlq: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the broker's: one line, not a traceback
        print(f"ackgate dlq: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


def _opener(broker: str) -> Callable[[str, Mapping[str, str]], DeadLetterBox]:
    found = {entry.name: entry for entry in entry_points(group=DEAD_LETTER_GROUP)}
    if broker not in found:
        known = ", ".join(sorted(found)) or "none"
        raise DlqUsage(
            f"no adapter reads {broker!r} dead letters (installed: {known}); "
            f"pip install 'ackgate[{broker}]'"
        )
    opener: Callable[[str, Mapping[str, str]], DeadLetterBox] = found[broker].load()
    return opener


async def _run(box: DeadLetterBox, opts: argparse.Namespace, out: TextIO) -> int:
    try:
        letters = await box.read()
        if opts.dlq_action == "list":
            _print_groups(letters, opts.json, out)
            return 0
        if opts.dlq_action == "show":
            letter = next((x for x in letters if opts.id in (x.id, x.original_id)), None)
            if letter is None:
                raise DlqUsage(f"no dead letter {opts.id!r} in {opts.destination}")
            _print_letter(letter, out)
            return 0
        return await _replay(box, letters, opts, out)
    finally:
        await box.aclose()


def groups(letters: Sequence[DeadLetter]) -> Counter[tuple[str, str]]:
    """How many dead letters per ``(handler, reason)``: one per handler that rejected
    each (``"-"`` for a reject without a handler's reason)."""
    counts: Counter[tuple[str, str]] = Counter()
    for letter in letters:
        for pair in letter.rejections or (("-", letter.reason),):
            counts[pair] += 1
    return counts


def _print_groups(letters: Sequence[DeadLetter], as_json: bool, out: TextIO) -> None:
    counts = groups(letters)
    if as_json:
        rows = [
            {
                "handler": handler,
                "reason": reason,
                "count": count,
                "ids": [x.id for x in letters if (handler, reason) in x.rejections],
            }
            for (handler, reason), count in counts.most_common()
        ]
        replays = sum(1 for x in letters if x.replayed)
        print(json.dumps({"total": len(letters), "replays": replays, "groups": rows}), file=out)
        return
    print(f"{len(letters)} dead letters", file=out)
    for (handler, reason), count in counts.most_common():
        shown = reason if len(reason) <= _REASON_WIDTH else reason[: _REASON_WIDTH - 3] + "..."
        print(f"{count:>7}  {handler:<20}  {shown}", file=out)


def _print_letter(letter: DeadLetter, out: TextIO) -> None:
    print(f"id:          {letter.id}", file=out)
    print(f"original id: {letter.original_id}", file=out)
    print(f"source:      {letter.source or '-'}", file=out)
    print(f"replayed:    {letter.replayed}", file=out)
    print(f"reason:      {letter.reason}", file=out)
    print(f"key:         {letter.key!r}", file=out)
    for name, value in letter.headers.items():
        print(f"header:      {name}={value!r}", file=out)
    print(f"body:        {letter.body[:2000]!r}", file=out)


def chosen(letters: Sequence[DeadLetter], opts: argparse.Namespace) -> list[DeadLetter]:
    """The dead letters ``replay`` picks: by id, reason text or handler (all that are
    given must match); replays already only with ``--again``."""
    picked = []
    for letter in letters:
        if letter.replayed and not opts.again:
            continue
        if opts.ids and letter.id not in opts.ids and letter.original_id not in opts.ids:
            continue
        if opts.reason and opts.reason not in letter.reason:
            continue
        if opts.handler and opts.handler not in letter.handlers:
            continue
        picked.append(letter)
    return picked


async def _replay(
    box: DeadLetterBox, letters: Sequence[DeadLetter], opts: argparse.Namespace, out: TextIO
) -> int:
    picked = chosen(letters, opts)
    skipped = sum(1 for x in letters if x.replayed and not opts.again)
    where = f"to handler {opts.to_handler!r} only" if opts.to_handler else "to the source"
    if opts.service:
        where += f" of service {opts.service!r}"
    if opts.dry_run:
        for letter in picked:
            print(f"would replay {letter.id} ({letter.original_id}) {where}", file=out)
        print(
            f"dry run: {len(picked)} of {len(letters)} dead letters would be replayed "
            f"{where}; {skipped} replays already left alone",
            file=out,
        )
        return 0
    with _progress(len(picked), out) as advance:
        for letter in picked:
            await box.replay(letter, letter.replay_headers(opts.to_handler, opts.service))
            advance()
    print(
        f"replayed {len(picked)} of {len(letters)} dead letters {where}; "
        f"{skipped} replays already left alone (--again picks them)",
        file=out,
    )
    return 0


class _progress:
    """A rich progress bar on a terminal (the ``cli`` extra), else a line per 10 %."""

    def __init__(self, total: int, out: TextIO) -> None:
        self._total = total
        self._out = out
        self._done = 0
        self._bar: Any = None

    def __enter__(self) -> Callable[[], None]:
        if self._out.isatty():
            try:
                from rich.progress import Progress
            except ImportError:
                pass
            else:
                self._bar = Progress(transient=True)
                self._bar.start()
                self._task = self._bar.add_task("replaying", total=self._total)
        return self._advance

    def _advance(self) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
        elif self._total >= 20 and self._done % max(1, self._total // 10) == 0:
            print(f"replayed {self._done}/{self._total}", file=self._out)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
