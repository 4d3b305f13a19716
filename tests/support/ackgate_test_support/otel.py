"""OpenTelemetry SDK providers for a test: ``with otel_sdk() as (reader, spans):``.

The API lets a process set its global providers once; a test needs its own, so this
resets the API's globals on the way in and out (as OpenTelemetry's own test utilities
do) and gives the in-memory metric reader and span exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.propagate import inject
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from ackgate import Message, Service, SharedStreamProducer


def _reset() -> None:
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextlib.contextmanager
def installed(meter_provider: MeterProvider, tracer_provider: TracerProvider) -> Iterator[None]:
    """The two providers as the global ones while inside; shut down on the way out."""
    _reset()
    metrics.set_meter_provider(meter_provider)
    trace.set_tracer_provider(tracer_provider)
    try:
        yield
    finally:
        _reset()
        meter_provider.shutdown()
        tracer_provider.shutdown()


@contextlib.contextmanager
def otel_sdk() -> Iterator[tuple[InMemoryMetricReader, InMemorySpanExporter]]:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    with installed(MeterProvider(metric_readers=[reader]), tracer_provider):
        yield reader, spans


def points(reader: InMemoryMetricReader, service: str) -> dict[str, list[Any]]:
    """Every data point of ``service`` (its ``ackgate.service`` attribute), by metric name."""
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if point.attributes.get("ackgate.service") == service:
                        found.setdefault(metric.name, []).append(point)
    return found


async def trace_through(
    make: Callable[[], SharedStreamProducer],
    send: Callable[[dict[str, str]], Awaitable[None]],
    system: str,
) -> None:
    """A producer span injects its context and ``send(carrier)`` puts it in the broker's
    native place; a Service with one handler reads it. Asserts the handler's span
    continues the producer's trace (same trace id, the producer span its parent), has
    the messaging attributes, and that a log record made in the handler carries both
    ids."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("ackgate.test.traced_handler")
    keep = Keep()
    log.addHandler(keep)
    try:
        with otel_sdk() as (_reader, spans):
            with trace.get_tracer("test producer").start_as_current_span(
                "send", kind=trace.SpanKind.PRODUCER
            ) as sent:
                carrier: dict[str, str] = {}
                inject(carrier)
            await send(carrier)
            assert "traceparent" in carrier
            service = Service(f"traced-{system}", producer=make)
            handled = asyncio.Event()

            @service.handler("tracer")
            async def handle(message: Message) -> None:
                log.warning("handling %s", message.id)
                handled.set()

            async with asyncio.timeout(60):
                running = asyncio.create_task(service.run())
                try:
                    await handled.wait()
                finally:
                    await service.stop(5)
                    await running
            finished = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.CONSUMER]
    finally:
        log.removeHandler(keep)
    sent_context = sent.get_span_context()
    span = finished[0]
    assert span.context.trace_id == sent_context.trace_id
    assert span.parent is not None and span.parent.span_id == sent_context.span_id
    assert span.attributes["messaging.system"] == system
    assert span.attributes["ackgate.handler"] == "tracer"
    assert span.attributes["messaging.operation.type"] == "process"
    assert "messaging.message.id" in span.attributes
    assert "messaging.destination.name" in span.attributes
    record = records[0]
    assert getattr(record, "otelTraceID", None) == format(sent_context.trace_id, "032x")
    assert getattr(record, "otelSpanID", None) == format(span.context.span_id, "016x")
