"""The operability options of ``ackgate run``: ``--health-port``, ``--health-host``,
``--metrics-port``, ``--metrics-host`` and ``--workers`` (the servers themselves are in
:mod:`ackgate._operating.health`, :mod:`ackgate._service.telemetry` and
:mod:`ackgate._operating.worker_processes`)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ackgate._operating.args import BadTarget, int_at_least, port
from ackgate._operating.health import HealthServer, loop_probes
from ackgate._operating.worker_processes import (
    INDEX_ENV,
    REPORT_FD_ENV,
    Workers,
    report_health_port,
    watch_parent,
    worker_command,
)

if TYPE_CHECKING:
    from ackgate._service.service import Service

__all__ = [
    "WORKER_INDEX_ENV",
    "add_operability_options",
    "prepare_operability",
    "run_workers",
    "start_health",
    "watch_parent",
]

logger = logging.getLogger("ackgate.run")

WORKER_INDEX_ENV = INDEX_ENV


def add_operability_options(run: Any) -> None:
    """Add ``--health-port``, ``--health-host``, ``--metrics-port``, ``--metrics-host``
    and ``--workers``."""
    run.add_argument(
        "--health-port",
        type=port,
        metavar="PORT",
        help="serve GET /livez (the event loop answers within 1s), GET /readyz (every "
        "service has a live group, not paused, its broker connected), GET /status.json "
        "and a status page at / on this port",
    )
    run.add_argument(
        "--health-host",
        default="0.0.0.0",
        metavar="HOST",
        help="address the health endpoints listen on; they say which services are not "
        "ready and why, so bind them to the pod's or the loopback address "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve the OpenTelemetry metrics in Prometheus text format on this port "
        "(needs the otel extra: pip install 'ackgate[otel]'); with --workers N, "
        "worker i serves on PORT+i",
    )
    run.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="address the metrics endpoint listens on; the metrics name the services, "
        "handlers and topics or queues, so bind it to the pod's or the loopback address "
        "(default: --health-host)",
    )
    run.add_argument(
        "--workers",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="run N worker processes, each with its own copy of the services; signals are "
        "forwarded, a worker that dies is started again (default: %(default)s)",
    )


def check_metrics_extra(opts: argparse.Namespace) -> None:
    """``--metrics-port`` needs the otel extra: ``BadTarget`` naming what to install
    when it is missing. Caller: ``ackgate run``, before any worker process starts (each
    would fail alike, after importing the services)."""
    if opts.metrics_port is None:
        return
    for module in (
        "opentelemetry.metrics",
        "opentelemetry.exporter.prometheus",
        "opentelemetry.sdk.metrics",
        "prometheus_client",
    ):
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise BadTarget(
                f"--metrics-port needs the otel extra ({error.name} is missing): "
                "pip install 'ackgate[otel]'"
            ) from None


def prepare_operability(opts: argparse.Namespace) -> None:
    """Before the services are imported: serve ``--metrics-port`` (the global meter
    provider becomes the SDK's, read by a Prometheus exporter). ``ValueError`` naming
    what to install when the otel extra is missing."""
    if opts.metrics_port is None:
        return
    check_metrics_extra(opts)
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(opts.metrics_port, addr=metrics_host(opts))
    except OSError as error:
        raise BadTarget(f"--metrics-port {opts.metrics_port}: {error.strerror}") from None
    # Without the otel_scope_* labels on every series: ackgate is the only scope. An
    # exporter older than the option (opentelemetry-python #5123) keeps its labels.
    try:
        reader = PrometheusMetricReader(scope_info_enabled=False)
    except TypeError:
        reader = PrometheusMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    logger.info(
        "metrics in Prometheus text format on port %d (address %s)",
        server.server_port,
        metrics_host(opts),
    )


def metrics_host(opts: argparse.Namespace) -> str:
    """The address ``--metrics-port`` listens on: ``--metrics-host``, else ``--health-host``."""
    host: str | None = getattr(opts, "metrics_host", None)
    return opts.health_host if host is None else host


def start_health(
    loop: asyncio.AbstractEventLoop,
    services: Sequence[Service],
    opts: argparse.Namespace | None,
) -> Callable[[], None]:
    """Serve ``--health-port`` for ``services`` on ``loop``; return what stops it."""
    if opts is None or getattr(opts, "health_port", None) is None:
        return lambda: None
    # A worker's own server is for its parent only: loopback, whatever --health-host says.
    host = "127.0.0.1" if os.environ.get(REPORT_FD_ENV) else opts.health_host
    try:
        server = HealthServer(host, opts.health_port, loop_probes(loop, services))
    except OSError as error:
        raise BadTarget(f"--health-port {opts.health_port}: {error.strerror}") from None
    report_health_port(server.port)  # a worker tells its parent where to ask
    logger.info(
        "health endpoints /livez, /readyz, /status.json and the status page / on port %d",
        server.port,
    )
    return server.close


def run_workers(opts: argparse.Namespace) -> int:
    """``--workers N`` (N > 1): the parent; the exit status (2, after one line on
    stderr, when the health port cannot be bound)."""
    argv = list(getattr(opts, "argv", ()))
    after_run = argv[argv.index("run") + 1 :] if "run" in argv else list(opts.targets)
    workers = Workers(
        worker_command(after_run),
        opts.workers,
        opts.metrics_port,
        health=opts.health_port is not None,
    )
    try:
        return asyncio.run(workers.run(opts.health_host, opts.health_port))
    except OSError as error:  # only the health server's bind raises it before the workers
        print(f"ackgate run: --health-port {opts.health_port}: {error.strerror}", file=sys.stderr)
        return 2
