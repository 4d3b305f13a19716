"""``ackgate run MODULE:ATTR [MODULE:ATTR ...]``: run services until a signal stops them.

Each target names a :class:`~ackgate.Service`, or a list or tuple of them, in an
importable module (the current directory is importable, as with ``uvicorn``). All
of them run in one event loop. The first SIGTERM or SIGINT stops every service
gracefully (``stop(timeout=--shutdown-timeout)``); a second one stops them at once
(their ``run()`` is cancelled: calls in progress fail and are redelivered).

Exit status: 0 after a graceful stop; 1 when a service failed (its ``run()`` raised:
a producer factory's configuration error, ``--max-restarts`` reached, ...; the
others are stopped gracefully first), a module raised while being imported, or a
second signal cut the stop short; 2 for a bad command line or target; ``n`` when a
service's ``run()`` raised ``SystemExit(n)`` (the others are stopped gracefully
first). A failure is one line on stderr; its traceback only with ``--log-level DEBUG``.

``--health-port``, ``--metrics-port`` and ``--workers`` are :mod:`ackgate._operating.run_options`'s.

Once the modules are imported, the cyclic garbage collector's first-generation
threshold goes from CPython's 700 to :data:`GC_THRESHOLD` (see :func:`tune_gc`),
unless a module set the collector up itself.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import gc
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ackgate._operating.args import BadTarget, int_at_least, positive_seconds, seconds
from ackgate._operating.log_setup import configure_logging
from ackgate._operating.run_options import (
    WORKER_INDEX_ENV,
    add_operability_options,
    check_metrics_extra,
    prepare_operability,
    run_workers,
    start_health,
    watch_parent,
)
from ackgate._service.service import Service

logger = logging.getLogger("ackgate.run")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: The cyclic collector's first-generation threshold ``ackgate run`` sets. A consumer
#: allocates several container objects per message (the client's record, the broker
#: payload, the ``Message``) and holds them until every handler is done: with
#: CPython's 700 a young collection runs every few hundred messages and promotes what
#: is in flight, so the older generations fill and are traversed again and again.
#: On the Kafka benchmark (four batch handlers) collections took ~29 % of the
#: process's CPU (268 of 918 ms per 100,000 records) at 700, 80 ms at 10,000.
GC_THRESHOLD = 10_000

#: CPython's own thresholds (3.11 to 3.13): only these are replaced.
_CPYTHON_GC_THRESHOLDS = (700, 10, 10)

RUN_DESCRIPTION = """\
Run one or more ackgate Services (MODULE:ATTR names a Service, or a list of them;
the current directory is importable). SIGTERM or SIGINT stops them gracefully: no
new message is handed to a handler, calls in progress get --shutdown-timeout
seconds, what finished is committed. A second signal stops at once. Exit 0 after a
graceful stop; 1 when a service failed (the others are stopped gracefully), a module
raised while imported, or the stop was forced; 2 for a bad command line or target."""


class ImportFailed(Exception):
    """The module of a target exists but raised while being imported (its ``__cause__``)."""


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
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long calls in progress get to finish on a graceful stop (default: %(default)s)",
    )
    run.add_argument(
        "--log-level",
        type=_level,
        default="INFO",
        metavar="LEVEL",
        help=f"ackgate's and the services' own loggers: one of {', '.join(LOG_LEVELS)} "
        "(default: %(default)s); the broker clients' loggers stay at INFO or above",
    )
    run.add_argument(
        "--client-log-level",
        type=_level,
        metavar="LEVEL",
        help="the broker client libraries' loggers (aiokafka, botocore, google, grpc, "
        "azure...): DEBUG logs their wire-level exchanges, which hold credentials and "
        "message bodies (bytes are redacted; do not ship these logs) (default: "
        "--log-level, at least INFO)",
    )
    run.add_argument(
        "--max-restarts",
        type=int_at_least(0),
        metavar="N",
        help=(
            "every service fails (exit 1) when its group ended again after N restarts in a "
            "row with no message advanced; overrides each service's restart_limit "
            "(default: the services' own, unlimited unless set)"
        ),
    )
    run.add_argument(
        "--retry-on-auth-error",
        type=positive_seconds,
        metavar="SECONDS",
        help=(
            "when the broker refuses a service (credentials, TLS verification, access "
            "denied), start its group again every SECONDS instead of failing (exit 1); "
            "overrides each service's retry_on_auth_error (default: the services' own, "
            "a refusal is permanent unless set)"
        ),
    )
    add_operability_options(run)


def run_command(opts: argparse.Namespace) -> int:
    """Run the services of ``opts.targets``; return the exit status."""
    worker = os.environ.get(WORKER_INDEX_ENV)
    configure_logging(opts.log_level, opts.client_log_level, worker=worker)
    try:
        check_metrics_extra(opts)  # once, before any worker process starts
    except BadTarget as error:
        print(f"ackgate run: {error}", file=sys.stderr)
        return 2
    if opts.workers > 1:
        return run_workers(opts)
    try:
        prepare_operability(opts)  # before the import: a module may log or make spans
        services = load_services(opts.targets)
    except BadTarget as error:
        print(f"ackgate run: {error}", file=sys.stderr)
        return 2
    except ImportFailed as error:
        cause = error.__cause__
        assert cause is not None
        debug = opts.log_level == "DEBUG"
        if debug:
            traceback.print_exception(cause)
        print(f"ackgate run: {error}: {_one_line(cause, debug=debug)}", file=sys.stderr)
        return 1
    for service in services:
        if opts.max_restarts is not None:
            service._set_restart_limit(opts.max_restarts)
        if opts.retry_on_auth_error is not None:
            service._set_retry_on_auth_error(opts.retry_on_auth_error)
    tune_gc()  # after the imports: a module's own collector settings win
    try:
        return asyncio.run(serve(services, opts.shutdown_timeout, opts))
    except BadTarget as error:  # e.g. the health port is taken
        print(f"ackgate run: {error}", file=sys.stderr)
        return 2


def tune_gc() -> bool:
    """Raise the cyclic collector's first-generation threshold to :data:`GC_THRESHOLD`
    if the process still has CPython's defaults; return whether it did.

    Left alone: a collector that is disabled or whose thresholds differ from
    CPython's 700/10/10 (a module set them, or another interpreter version has other
    defaults). Only how often cycles are looked for changes, not what is freed:
    objects without cycles are freed at once as ever, cyclic garbage is found after
    at most 10,000 new container objects instead of 700.
    """
    if not gc.isenabled() or gc.get_threshold() != _CPYTHON_GC_THRESHOLDS:
        return False
    gc.set_threshold(GC_THRESHOLD, *_CPYTHON_GC_THRESHOLDS[1:])
    logger.debug(
        "garbage collector: first-generation threshold %d (CPython's default: %d)",
        GC_THRESHOLD,
        _CPYTHON_GC_THRESHOLDS[0],
    )
    return True


def _one_line(error: BaseException, *, debug: bool) -> str:
    """``error`` and its notes on one line, for an operator; the traceback is for DEBUG."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    for note in getattr(error, "__notes__", ()):
        text += f"; {note}"
    if not debug:
        text += " (--log-level DEBUG shows the traceback)"
    return text


def load_services(targets: Sequence[str]) -> list[Service]:
    """Import every ``MODULE:ATTR`` (cwd first on ``sys.path``); the services, deduplicated.

    ``BadTarget`` when a target is malformed, its module does not exist, the
    attribute is missing, or it is not a Service or a non-empty list of them.
    ``ImportFailed`` when the module raised an ``Exception`` while being imported (a
    bug or a configuration error there; a missing module it imports is one too).
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    services: dict[int, Service] = {}
    for target in targets:
        for service in _load(target):
            services.setdefault(id(service), service)
    return list(services.values())


#: ackgate's own adapter distributions, by the module each installs.
_ADAPTERS = {f"ackgate_{name}": name for name in ("kafka", "sqs", "pubsub", "servicebus")}


def _load(target: str) -> list[Service]:
    module_name, _, attr_path = target.partition(":")
    if not module_name or not attr_path:
        raise BadTarget(f"{target!r} is not MODULE:ATTR (e.g. myapp.consumers:service)")
    try:
        value: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        adapter = _ADAPTERS.get(missing)
        if adapter is not None:
            # The most common first-run mistake: the service is fine, its adapter is
            # simply not installed in this environment.
            raise BadTarget(
                f"cannot import {module_name!r}: the {adapter} adapter ({missing!r}) is not "
                f"installed; pip install 'ackgate[{adapter}]' (from a checkout: "
                f"pip install ./adapters/{adapter})"
            ) from None
        if missing != module_name and not module_name.startswith(missing + "."):
            # The module exists but imports something missing: its own bug.
            raise ImportFailed(f"importing {module_name!r} failed") from error
        raise BadTarget(f"cannot import {module_name!r}: no module named {missing!r}") from None
    except Exception as error:
        raise ImportFailed(f"importing {module_name!r} failed") from error
    for attr in attr_path.split("."):
        try:
            value = getattr(value, attr)
        except AttributeError:
            close = difflib.get_close_matches(attr, [n for n in dir(value) if n[:1] != "_"], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise BadTarget(
                f"{target!r}: {module_name!r} has no attribute {attr_path!r}{hint}"
            ) from None
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

    A ``SystemExit`` or ``KeyboardInterrupt`` out of a service's ``run()`` stops the
    others gracefully too, then propagates (the process exits with its code).

    ``opts``: the command's options for health endpoints (``--health-port``).
    Cancellation cancels every service's ``run()`` and propagates.
    """
    loop = asyncio.get_running_loop()
    close_health = start_health(loop, services, opts)
    runs = [
        loop.create_task(_running(service), name=f"ackgate run {service.key!r}")
        for service in services
    ]
    exiting: BaseException | None = None
    stopping: asyncio.Task[Any] | None = None
    signalled = forced = False

    def stop_all(reason: str | None) -> None:
        """``reason``: the signal received; ``None`` when a service failed."""
        nonlocal stopping, signalled, forced
        if stopping is None:
            signalled = reason is not None
            if reason is not None:
                logger.info(
                    "%s: stopping gracefully (up to %gs); send the signal again to stop at once",
                    reason,
                    shutdown_timeout,
                )
            elif pending:
                logger.info(
                    "stopping the other services gracefully (up to %gs); a signal stops them "
                    "at once",
                    shutdown_timeout,
                )
            stopping = loop.create_task(_stop_all(services, shutdown_timeout))
            return
        if reason is not None and not forced:
            forced = True
            logger.warning("%s%s: stopping at once", reason, " again" if signalled else "")
            for run in runs:
                run.cancel()

    restore = _on_signals(loop, stop_all)
    stop_watching_parent = watch_parent(lambda: stop_all("the parent process is gone"))
    try:
        failed = False
        pending = set(runs)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for run in done:
                if run.cancelled():
                    continue
                key = services[runs.index(run)].key
                error = run.exception()
                if error is not None:
                    failed = True
                    debug = logger.isEnabledFor(logging.DEBUG)
                    logger.error(
                        "service %r failed: %s",
                        key,
                        _one_line(error, debug=debug),
                        exc_info=error if debug else None,
                    )
                elif (exc := run.result()) is not None:
                    logger.warning(
                        "service %r raised %r: the process exits with it once every service "
                        "stopped",
                        key,
                        exc,
                    )
                    exiting = exiting or exc
            if (failed or exiting is not None) and stopping is None:
                stop_all(None)
        if stopping is not None:
            await asyncio.gather(stopping, return_exceptions=True)
    finally:
        restore()
        close_health()
        if stop_watching_parent is not None:
            stop_watching_parent()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
    if exiting is not None:
        raise exiting
    return 1 if failed or forced else 0


async def _running(service: Service) -> BaseException | None:
    """``service.run()``, with a ``SystemExit`` or ``KeyboardInterrupt`` it raises
    returned instead: raised in a task, it would leave the event loop at once and the
    other services would be cancelled rather than stopped gracefully."""
    try:
        await service.run()
    except (SystemExit, KeyboardInterrupt) as exc:
        return exc
    return None


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
