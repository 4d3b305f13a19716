"""OpenTelemetry SDK providers for a test: ``with otel_sdk() as (reader, spans):``.

The API lets a process set its global providers once; a test needs its own, so this
resets the API's globals on the way in and out (as OpenTelemetry's own test utilities
do) and gives the in-memory metric reader and span exporter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _reset() -> None:
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextlib.contextmanager
def otel_sdk() -> Iterator[tuple[InMemoryMetricReader, InMemorySpanExporter]]:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    _reset()
    metrics.set_meter_provider(meter_provider)
    trace.set_tracer_provider(tracer_provider)
    try:
        yield reader, spans
    finally:
        _reset()
        meter_provider.shutdown()
        tracer_provider.shutdown()


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
