"""``ackgate run MODULE:ATTR [MODULE:ATTR ...]``: run services until a signal stops them.

Each target names a :class:`~ackgate.Service`, or a list or tuple of them, in an
importable module (the current directory is importable, as with ``uvicorn``). All
of them run in one event loop. The first SIGTERM or SIGINT stops every service
gracefully (``stop(timeout=--shutdown-timeout)``); a second one stops them at once
(their ``run()`` is cancelled: calls in progress fail and are redelivered).

Exit status: 0 after a graceful stop; 1 when a service failed, or a second signal
cut the stop short; 2 for a bad target (one line on stderr, no traceback).

``--health-port``, ``--metrics-port`` and ``--workers`` are :mod:`ackgate._operate`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ackgate._operate import (
    WORKER_INDEX_ENV,
    add_operability_options,
    prepare_operability,
    run_workers,
    start_health,
    watch_parent,
)
from ackgate._service import Service

logger = logging.getLogger("ackgate.run")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

RUN_DESCRIPTION = """\
Run one or more ackgate Services (MODULE:ATTR names a Service, or a list of them;
the current directory is importable). SIGTERM or SIGINT stops them gracefully: no
new message is handed to a handler, calls in progress get --shutdown-timeout
seconds, what finished is committed. A second signal stops at once. Exit 0 after a
graceful stop, 1 when a service failed or the stop was forced, 2 for a bad target."""


class BadTarget(Exception):
    """A ``MODULE:ATTR`` that does not name services; the message is the one line shown."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"pick from {', '.join(LOG_LEVELS)}, got {text!r}")
    return text.upper()


def add_parser(commands: Any) -> None:
    """Add the ``run`` subcommand to the ``ackgate`` command's subparsers."""
    run = commands.add_parser(
        "run",
        help="run Service objects until SIGTERM or SIGINT",
        description=RUN_DESCRIPTION,
    )
    run.add_argument("targets", nargs="+", metavar="MODULE:ATTR", help="services to run")
    run.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long calls in progress get to finish on a graceful stop (default: %(default)s)",
    )
    run.add_argument(
        "--log-level",
        type=_level,
        default="INFO",
        metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)} (default: %(default)s)",
    )
    add_operability_options(run)


def run_command(opts: argparse.Namespace) -> int:
    """Run the services of ``opts.targets``; return the exit status."""
    worker = os.environ.get(WORKER_INDEX_ENV)
    logging.basicConfig(
        level=opts.log_level,
        format="%(asctime)s %(levelname)s "
        + ("" if worker is None else f"[worker {worker}] ")
        + "%(name)s: %(message)s",
    )
    if opts.workers > 1:
        return run_workers(opts)
    try:
        prepare_operability(opts)  # before the import: a module may log or make spans
        services = load_services(opts.targets)
    except BadTarget as error:
        print(f"ackgate run: {error}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(services, opts.shutdown_timeout, opts))
    except BadTarget as error:  # e.g. the health port is taken
        print(f"ackgate run: {error}", file=sys.stderr)
        return 2


def load_services(targets: Sequence[str]) -> list[Service]:
    """Import every ``MODULE:ATTR`` (cwd first on ``sys.path``); the services, deduplicated.

    ``BadTarget`` when a target is malformed, its module does not exist, the
    attribute is missing, or it is not a Service or a non-empty list of them. Any
    other error raised while importing the module propagates (it is a bug there).
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    services: dict[int, Service] = {}
    for target in targets:
        for service in _load(target):
            services.setdefault(id(service), service)
    return list(services.values())


def _load(target: str) -> list[Service]:
    module_name, _, attr_path = target.partition(":")
    if not module_name or not attr_path:
        raise BadTarget(f"{target!r} is not MODULE:ATTR (e.g. myapp.consumers:service)")
    try:
        value: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing != module_name and not module_name.startswith(missing + "."):
            raise  # the module exists but imports something missing: its own bug
        raise BadTarget(f"cannot import {module_name!r}: no module named {missing!r}") from None
    for attr in attr_path.split("."):
        try:
            value = getattr(value, attr)
        except AttributeError:
            raise BadTarget(f"{target!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if isinstance(value, Service):
        return [value]
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(item, Service) for item in value)
    ):
        return list(value)
    raise BadTarget(
        f"{target!r} is a {type(value).__name__}, not a Service or a non-empty list of them"
    )


async def serve(
    services: Sequence[Service], shutdown_timeout: float, opts: argparse.Namespace | None = None
) -> int:
    """Run ``services`` until a signal (or a failure) stops them; return the exit status.

    ``opts``: the command's options for health endpoints (``--health-port``).
    Cancellation cancels every service's ``run()`` and propagates.
    """
    loop = asyncio.get_running_loop()
    close_health = start_health(loop, services, opts)
    runs = [
        loop.create_task(service.run(), name=f"ackgate run {service.key!r}") for service in services
    ]
    stopping: asyncio.Task[Any] | None = None
    forced = False

    def stop_all(reason: str) -> None:
        nonlocal stopping, forced
        if stopping is None:
            logger.info(
                "%s: stopping gracefully (up to %gs); send the signal again to stop at once",
                reason,
                shutdown_timeout,
            )
            stopping = loop.create_task(_stop_all(services, shutdown_timeout))
            return
        if not forced:
            forced = True
            logger.warning("%s again: stopping at once", reason)
            for run in runs:
                run.cancel()

    restore = _on_signals(loop, stop_all)
    watch_parent(lambda: loop.call_soon_threadsafe(stop_all, "the parent process is gone"))
    try:
        failed = False
        pending = set(runs)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for run in done:
                if run.cancelled():
                    continue
                error = run.exception()
                if error is not None:
                    failed = True
                    logger.error("%s failed", run.get_name(), exc_info=error)
            if failed and stopping is None:
                stop_all("a service failed")
        if stopping is not None:
            await asyncio.gather(stopping, return_exceptions=True)
    finally:
        restore()
        close_health()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
    return 1 if failed or forced else 0


async def _stop_all(services: Sequence[Service], seconds: float) -> None:
    await asyncio.gather(*(service.stop(seconds) for service in services))


def _on_signals(
    loop: asyncio.AbstractEventLoop, handle: Callable[[str], None]
) -> Callable[[], object]:
    """Route SIGTERM and SIGINT to ``handle(reason)`` on the loop; return the undo."""
    signals = (signal.SIGTERM, signal.SIGINT)
    try:
        for signum in signals:
            loop.add_signal_handler(signum, handle, f"received {signal.Signals(signum).name}")
    except NotImplementedError:  # no loop signal handlers (Windows): plain handlers
        previous = {
            signum: signal.signal(
                signum,
                lambda signum, _frame: loop.call_soon_threadsafe(
                    handle, f"received {signal.Signals(signum).name}"
                ),
            )
            for signum in signals
        }
        return lambda: [signal.signal(signum, old) for signum, old in previous.items()]

    def restore() -> None:
        for signum in signals:
            loop.remove_signal_handler(signum)

    return restore
