"""OpenTelemetry metrics and traces of :class:`~ackgate.Service` s (the ``otel`` extra).

Everything goes through the OpenTelemetry *API*, imported lazily. A service decides
when its ``run()`` starts: with no API installed, or no SDK provider configured
(the API's default proxy or no-op provider), :func:`for_service` returns ``None``
and the handlers' calls run exactly as without this module: instrumentation costs
nothing then. Configure the SDK (or ``ackgate run --metrics-port``) before ``run()``.

What is recorded (names follow OpenTelemetry's messaging semantic conventions where
one exists, ``ackgate.*`` otherwise; every point carries ``ackgate.service``):

- per handler (``ackgate.handler``): ``ackgate.handler.messages`` (counter, by
  ``ackgate.outcome``: handled, rejected, failed, gave_up), ``ackgate.handler.in_progress``,
  ``ackgate.handler.behind`` (read and not finished by it) and
  ``messaging.process.duration`` (histogram of each call, in seconds, with
  ``error.type`` when it raised);
- per service group: ``ackgate.group.outstanding``, ``ackgate.group.oldest_outstanding_age``,
  ``ackgate.group.paused``, ``ackgate.group.upstream_connected``, ``ackgate.group.live``
  (gauges), ``ackgate.group.redeliveries_skipped``, ``ackgate.group.progress_overflows``,
  ``ackgate.group.advances``,
  ``ackgate.group.advanced_messages`` and ``ackgate.service.restarts`` (counters),
  ``ackgate.group.advance.duration`` (histogram);
- lag: ``ackgate.group.lag`` per ``ackgate.lane`` and ``ackgate.group.broker_messages``
  by ``ackgate.state`` (what the producer measures, ``SharedStreamProducer.broker_lag``),
  and ``ackgate.group.oldest_message_age``, whose labels name the oldest message not
  advanced (lane, key, id, the handlers holding it).

Counts are read from the service's own counters when a reader collects (observable
instruments), so the hot path only pays for the call histogram and the span.

Traces: each handler call is a ``CONSUMER`` span ``process <destination>`` with the
messaging attributes. A per-message call continues the W3C ``traceparent`` the
message carries in its headers (a Kafka header, an SQS message attribute, a Pub/Sub
attribute, a Service Bus application property), through the globally configured
propagator; a batch call links to each message's context. Log records made while a
span is current carry ``otelTraceID`` and ``otelSpanID`` (hex), as OpenTelemetry's
logging instrumentation names them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from ackgate._contract.message import Message, Reject

if TYPE_CHECKING:
    from ackgate._contract.producer import SharedStreamProducer
    from ackgate._service.calls import Job
    from ackgate._service.convert import MessageProducer
    from ackgate._service.handlers import HandlerSpec, OldestMessage, ServiceStats

SCOPE = "ackgate"


class Observed(Protocol):
    """What the instruments read of a running :class:`~ackgate.Service`: its key and its
    statistics (the service hands itself over; this layer's module does not import it)."""

    @property
    def key(self) -> Hashable: ...

    def stats(self) -> ServiceStats: ...


def sdk_configured() -> tuple[bool, bool]:
    """``(metrics, traces)``: whether an SDK provider of each is configured globally."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return False, False
    meter_provider = type(metrics.get_meter_provider()).__name__
    tracer_provider = type(trace.get_tracer_provider()).__name__
    return (
        meter_provider not in ("_ProxyMeterProvider", "NoOpMeterProvider"),
        tracer_provider not in ("ProxyTracerProvider", "NoOpTracerProvider"),
    )


def for_service(service: Observed) -> ServiceTelemetry | None:
    """The service's instrumentation, or ``None`` when no SDK is configured."""
    metered, traced = sdk_configured()
    if not (metered or traced):
        return None
    instruments = _instruments(metered)
    if instruments is not None:
        instruments.services[service] = asyncio.get_running_loop()
    if traced:
        _install_log_ids()
    return ServiceTelemetry(service, instruments, traced)


class ServiceTelemetry:
    """One running service's spans and call/advance histograms."""

    def __init__(self, service: Observed, instruments: _Instruments | None, traced: bool) -> None:
        from opentelemetry import context, propagate, trace

        self._instruments = instruments
        #: A message without trace context starts a trace of its own, whatever span
        #: was current where ``run()`` was called.
        self._root = context.Context()
        self._tracer = trace.get_tracer(SCOPE) if traced else None
        self._extract = propagate.extract
        self._link = trace.Link
        self._span_context_of = trace.get_current_span
        self._consumer = trace.SpanKind.CONSUMER
        self._error = trace.Status(trace.StatusCode.ERROR)
        self.service = str(service.key)
        self.system = "unknown"
        self.destination: str | None = None

    def producer_made(self, wrapper: MessageProducer, inner: SharedStreamProducer) -> None:
        """Caller: the service's producer factory, once per group life."""
        self.system = inner.messaging_system or "unknown"
        self.destination = inner.destination_name()
        if self._instruments is not None:
            wrapper.observe_advance = self._observe_advance

    def _observe_advance(self, events: int, seconds: float, error: BaseException | None) -> None:
        assert self._instruments is not None
        attributes = {"ackgate.service": self.service, "messaging.system": self.system}
        if error is not None:
            attributes["error.type"] = type(error).__qualname__
        self._instruments.advance_duration.record(seconds, attributes)
        self._instruments.advances.add(1, attributes)
        if error is None:
            self._instruments.advanced.add(events, attributes)

    def handler(self, spec: HandlerSpec) -> Callable[[Job], Awaitable[Any]]:
        """What a handler's :class:`~ackgate._service.calls.Calls` awaits instead of calling
        ``spec.function(job.argument)``: the same call, in a span and timed."""
        function = spec.function
        tracer = self._tracer
        duration = self._instruments.duration if self._instruments is not None else None
        base = {
            "ackgate.service": self.service,
            "ackgate.handler": spec.id,
            "messaging.operation.name": "process",
        }
        batched = spec.batched

        async def call(job: Job) -> Any:
            attributes = dict(base, **{"messaging.system": self.system})
            start = time.perf_counter()
            try:
                if tracer is None:
                    return await function(job.argument)
                span_attributes, parent, links = self._span_of(job.shown, batched)
                span_attributes.update(attributes)
                with tracer.start_as_current_span(
                    f"process {self.destination or self.system}",
                    context=parent,
                    kind=self._consumer,
                    links=links,
                    attributes=span_attributes,
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span:
                    try:
                        return await function(job.argument)
                    except Reject as reject:
                        span.set_attribute("ackgate.outcome", "rejected")
                        if reject.reason is not None:
                            span.set_attribute("ackgate.reject_reason", reject.reason)
                        raise
                    except BaseException as error:
                        span.record_exception(error)
                        span.set_status(self._error)
                        span.set_attribute("error.type", type(error).__qualname__)
                        raise
            except Reject:
                raise
            except BaseException as error:
                attributes["error.type"] = type(error).__qualname__
                raise
            finally:
                if duration is not None:
                    duration.record(time.perf_counter() - start, attributes)

        return call

    def _span_of(
        self, messages: Sequence[Message], batched: bool
    ) -> tuple[dict[str, Any], Any, list[Any] | None]:
        """A call's span attributes, its parent context and its links."""
        attributes: dict[str, Any] = {"messaging.operation.type": "process"}
        if self.destination is not None:
            attributes["messaging.destination.name"] = self.destination
        if not batched:
            message = messages[0]
            attributes["messaging.message.id"] = message.id
            attributes["ackgate.message.lane"] = str(message.lane)
            if message.attempt is not None:
                attributes["ackgate.message.attempt"] = message.attempt
            if self.destination is None and self.system == "kafka":
                attributes["messaging.destination.name"] = message.id.rsplit("/", 2)[0]
            return attributes, self._carried(message), None
        attributes["messaging.batch.message_count"] = len(messages)
        links = []
        extract = self._extract
        span_of = self._span_context_of
        for message in messages:
            headers = message.headers
            if headers:  # most messages of a batch carry no trace context: skip them cheaply
                context = span_of(extract(headers, getter=_HEADERS)).get_span_context()
                if context.is_valid:
                    links.append(self._link(context))
        return attributes, None, links

    def _carried(self, message: Message) -> Any:
        """The trace context ``message`` carries (an empty context when none)."""
        headers = message.headers
        if not headers:
            return self._root
        return self._extract(headers, getter=_HEADERS)


class _HeaderGetter:
    """Reads ``Message.headers`` (``str -> bytes``) for OpenTelemetry's propagators."""

    def get(self, carrier: Mapping[str, bytes], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            return None
        return [value.decode("utf-8", "replace")]

    def keys(self, carrier: Mapping[str, bytes]) -> list[str]:
        return list(carrier)


#: Duck-typed as the API's ``Getter`` (subclassing it would import the API eagerly).
_HEADERS: Any = _HeaderGetter()


#: The messaging conventions' advised boundaries for durations in seconds.
_SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]


class _Instruments:
    """The process's instruments, made once, shared by every instrumented service."""

    def __init__(self) -> None:
        from opentelemetry import metrics

        meter = metrics.get_meter(SCOPE)
        #: Running services the observable instruments report on (gone when collected),
        #: and the loop each runs on: their statistics are read there.
        self.services: weakref.WeakKeyDictionary[Observed, asyncio.AbstractEventLoop] = (
            weakref.WeakKeyDictionary()
        )
        #: ``(monotonic time, snapshot)``: one collection's callbacks share one snapshot.
        self._snapshot: tuple[float, list[tuple[Observed, ServiceStats]]] = (-1.0, [])
        self.duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Duration of each handler call (a batch handler's: its whole batch).",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.advance_duration = meter.create_histogram(
            "ackgate.group.advance.duration",
            unit="s",
            description="Duration of each advance (commit, delete, ack, complete) call.",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.advances = meter.create_counter(
            "ackgate.group.advances", unit="{call}", description="Advance calls made."
        )
        self.advanced = meter.create_counter(
            "ackgate.group.advanced_messages",
            unit="{message}",
            description="Messages advanced past (committed, deleted, acked, completed).",
        )
        observations = self._observations
        meter.create_observable_counter(
            "ackgate.handler.messages",
            [lambda _options: observations("messages")],
            unit="{message}",
            description="Messages each handler finished, by ackgate.outcome.",
        )
        meter.create_observable_up_down_counter(
            "ackgate.handler.in_progress",
            [lambda _options: observations("in_progress")],
            unit="{message}",
            description="Messages in a handler call right now (retry backoffs included).",
        )
        meter.create_observable_gauge(
            "ackgate.handler.behind",
            [lambda _options: observations("behind")],
            unit="{message}",
            description="Messages read from the broker that the handler has not finished.",
        )
        meter.create_observable_gauge(
            "ackgate.group.lag",
            [lambda _options: observations("lag")],
            unit="{message}",
            description="Per lane (ackgate.lane): the broker's end offset minus the committed "
            "one, as the producer last measured it.",
        )
        meter.create_observable_gauge(
            "ackgate.group.broker_messages",
            [lambda _options: observations("broker_messages")],
            unit="{message}",
            description="Messages in the broker's queue by ackgate.state: waiting (not handed "
            "out yet) or in_flight (handed out, not advanced), as the producer last measured.",
        )
        meter.create_observable_gauge(
            "ackgate.group.oldest_message_age",
            [lambda _options: observations("oldest_message")],
            unit="s",
            description="Age of the oldest message read and not advanced, named by its labels: "
            "ackgate.lane, ackgate.message.key, messaging.message.id and ackgate.handlers "
            "(the handlers holding it, comma-separated).",
        )
        meter.create_observable_counter(
            "ackgate.group.redeliveries_skipped",
            [lambda _options: observations("skipped")],
            unit="{message}",
            description="Redelivered copies not handed again to handlers that had acked them.",
        )
        meter.create_observable_counter(
            "ackgate.group.progress_overflows",
            [lambda _options: observations("progress_overflows")],
            unit="{commit}",
            description=(
                "Records of per-handler progress cut to fit the broker's limit (a Kafka "
                "offset map): duplicates after a restart, never a loss. Per group life."
            ),
        )
        meter.create_observable_counter(
            "ackgate.service.restarts",
            [lambda _options: observations("restarts")],
            unit="{restart}",
            description="Times a service's group ended and was started again.",
        )
        for name, unit, description in (
            ("live", "1", "1 while the service has a live group, else 0."),
            ("outstanding", "{message}", "Messages read and not yet advanced."),
            (
                "oldest_outstanding_age",
                "s",
                "Age of the oldest message read and not yet advanced.",
            ),
            ("paused", "1", "1 while a roster member is missing and nothing new is read."),
            ("upstream_connected", "1", "1 while the broker is reachable."),
        ):
            meter.create_observable_gauge(
                f"ackgate.group.{name}",
                [partial(self._gauge, name)],
                unit=unit,
                description=description,
            )

    def _gauge(self, name: str, _options: Any) -> Iterator[Any]:
        return self._observations(name)

    def _stats(self) -> list[tuple[Observed, ServiceStats]]:
        """Every service's statistics, read on its own loop (a reader may collect from
        another thread, e.g. the Prometheus exporter's HTTP server). A loop that does
        not answer within a second is left out of this collection."""
        taken, snapshot = self._snapshot
        now = time.monotonic()
        if now - taken < _SNAPSHOT_LIFE:
            return snapshot
        snapshot = []
        for service, loop in list(self.services.items()):
            if loop.is_closed():
                continue
            try:
                if asyncio.get_running_loop() is loop:
                    snapshot.append((service, service.stats()))
                    continue
            except RuntimeError:  # no loop in this thread
                pass
            answer = asyncio.run_coroutine_threadsafe(_stats_of(service), loop)
            try:
                snapshot.append((service, answer.result(timeout=1.0)))
            except concurrent.futures.TimeoutError:
                answer.cancel()
        self._snapshot = (now, snapshot)
        return snapshot

    def _observations(self, what: str) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        for service, stats in self._stats():
            if stats.state != "running" and what != "restarts":
                continue
            attributes = {"ackgate.service": str(service.key)}
            group = stats.group
            if what == "messages":
                for handler in stats.handlers.values():
                    for outcome in ("handled", "rejected", "failed", "gave_up"):
                        yield Observation(
                            getattr(handler, outcome),
                            dict(
                                attributes,
                                **{"ackgate.handler": handler.id, "ackgate.outcome": outcome},
                            ),
                        )
            elif what == "in_progress":
                for handler in stats.handlers.values():
                    yield Observation(
                        handler.in_progress, dict(attributes, **{"ackgate.handler": handler.id})
                    )
            elif what == "behind":
                for handler in stats.handlers.values():
                    yield Observation(
                        handler.behind, dict(attributes, **{"ackgate.handler": handler.id})
                    )
            elif what == "oldest_message":
                oldest = stats.oldest
                if oldest is not None:
                    yield Observation(oldest.age, dict(attributes, **_named_labels(oldest)))
            elif what in ("lag", "broker_messages"):
                lag = None if group is None else group.broker_lag
                if lag is None:
                    continue
                if what == "lag":
                    for lane, lane_lag in lag.lanes.items():
                        lane_label = {"ackgate.lane": _label(lane)}
                        yield Observation(lane_lag, dict(attributes, **lane_label))
                    continue
                for state, count in (("waiting", lag.waiting), ("in_flight", lag.in_flight)):
                    if count is not None:
                        yield Observation(count, dict(attributes, **{"ackgate.state": state}))
            elif what == "skipped":
                yield Observation(
                    sum(h.redeliveries_skipped for h in stats.handlers.values()), attributes
                )
            elif what == "restarts":
                yield Observation(stats.restarts, attributes)
            elif what == "live":
                yield Observation(int(group is not None), attributes)
            elif group is not None:
                value: float = getattr(group, what)
                if what in ("upstream_connected", "paused"):
                    value = int(value)
                yield Observation(value, attributes)


#: Characters of a key kept in a label (a key can be a whole document).
_LABEL_LIMIT = 64


def _label(value: Any) -> str:
    """A lane or key as a metric label: a str as it is, bytes decoded, else repr; cut."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    else:
        text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _LABEL_LIMIT else text[: _LABEL_LIMIT - 1] + "…"


def _named_labels(oldest: OldestMessage) -> dict[str, str]:
    return {
        "ackgate.lane": _label(oldest.lane),
        "ackgate.message.key": "" if oldest.key is None else _label(oldest.key),
        "messaging.message.id": oldest.id,
        "ackgate.handlers": ",".join(oldest.handlers),
    }


#: The instruments and the meter provider they were made with: made again only if
#: the global provider was replaced (tests do; a service sets it up once).
_made: tuple[object, _Instruments] | None = None

#: Seconds one snapshot of the services' statistics serves a collection's callbacks.
_SNAPSHOT_LIFE = 0.25


async def _stats_of(service: Observed) -> ServiceStats:
    return service.stats()


def _instruments(metered: bool) -> _Instruments | None:
    global _made
    if not metered:
        return None
    from opentelemetry import metrics

    provider = metrics.get_meter_provider()
    if _made is None or _made[0] is not provider:
        _made = (provider, _Instruments())
    return _made[1]


_log_ids_installed = False


def _install_log_ids() -> None:
    """Give every log record made inside a span ``otelTraceID`` and ``otelSpanID``."""
    global _log_ids_installed
    if _log_ids_installed:
        return
    _log_ids_installed = True
    from opentelemetry import trace

    previous = logging.getLogRecordFactory()
    current_span = trace.get_current_span

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = previous(*args, **kwargs)
        context = current_span().get_span_context()
        if context.is_valid:
            made.otelTraceID = format(context.trace_id, "032x")
            made.otelSpanID = format(context.span_id, "016x")
        return made

    logging.setLogRecordFactory(record)
