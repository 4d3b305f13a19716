"""docs/production.md#watching-it metrics and traces through the OpenTelemetry SDK's in-memory
reader and exporter: every instrument after a known run, exact counts; a handler span continues the
message's ``traceparent``; logs inside a handler carry the ids."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.propagate import inject

from ackgate import BrokerLag, Message, Redelivery, Reject, Service
from ackgate._service.telemetry import sdk_configured
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate_test_support.otel import otel_sdk, points

#: A redelivery backoff past half the ack timeout: a failed message is failed to the
#: broker, which redelivers it (docs/failure-semantics.md#redelivery-to-the-failing-handler).
BROKER_REDELIVERS = Redelivery(backoff=1e3, max_backoff=1e3)


def value(found: dict[str, list[Any]], name: str, **attributes: str) -> Any:
    matching = [
        p for p in found[name] if all(p.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(matching) == 1, (name, attributes, matching)
    return matching[0]


async def test_every_instrument_after_a_known_run(broker: MemoryBroker, running: Any) -> None:
    for n in range(10):
        broker.publish("orders", b"bad" if n in (2, 7) else b"m%d" % n)
    with otel_sdk() as (reader, _spans):
        service = Service(
            "metered",
            producer=lambda: MemoryStreamProducer(broker, "orders", "g"),
            redelivery=BROKER_REDELIVERS,
        )
        flaked = asyncio.Event()

        @service.handler("indexer", concurrency=4)
        async def index(message: Message) -> None:
            pass

        @service.handler("auditor")
        async def audit(message: Message) -> None:
            if message.body == b"bad":
                raise Reject("not an order")
            if message.body == b"m5" and not flaked.is_set():
                flaked.set()
                raise RuntimeError("flaky")

        @service.handler("bulk", batch_size=100, batch_wait=0.01)
        async def bulk(messages: list[Message]) -> None:
            pass

        async with running(service):
            await broker.wait_drained("orders", "g")
            found = points(reader, "metered")
            stats = service.stats()
            assert stats.group is not None

    handled = {"indexer": 10, "auditor": 8, "bulk": 10}
    for handler, count in handled.items():
        messages = value(
            found,
            "ackgate.handler.messages",
            **{"ackgate.handler": handler, "ackgate.outcome": "handled"},
        )
        assert messages.value == count
        assert (
            value(found, "ackgate.handler.in_progress", **{"ackgate.handler": handler}).value == 0
        )
    for outcome, count in (("rejected", 2), ("failed", 1), ("gave_up", 0)):
        point = value(
            found,
            "ackgate.handler.messages",
            **{"ackgate.handler": "auditor", "ackgate.outcome": outcome},
        )
        assert point.value == count
    # One call per message for per-message handlers (the auditor's failed call too);
    # the failed call is told apart by error.type.
    durations = {
        (p.attributes["ackgate.handler"], p.attributes.get("error.type")): p
        for p in found["messaging.process.duration"]
    }
    assert durations["indexer", None].count == 10
    assert durations["auditor", None].count == 10  # rejections are outcomes, not errors
    assert durations["auditor", "RuntimeError"].count == 1
    assert durations["bulk", None].count >= 1 and durations["bulk", None].sum > 0
    assert value(found, "ackgate.group.live").value == 1
    assert value(found, "ackgate.group.outstanding").value == 0
    assert value(found, "ackgate.group.oldest_outstanding_age").value == 0.0
    assert value(found, "ackgate.group.paused").value == 0
    assert value(found, "ackgate.group.upstream_connected").value == 1
    # m5 failed for the auditor only: the broker redelivers from it, and the copies
    # go to the auditor only (how many depends on what its partition had read).
    skipped = sum(h.redeliveries_skipped for h in stats.handlers.values())
    assert skipped >= 2
    assert value(found, "ackgate.group.redeliveries_skipped").value == skipped
    assert value(found, "ackgate.service.restarts").value == 0
    assert value(found, "ackgate.group.progress_overflows").value == 0
    advances = value(found, "ackgate.group.advances").value
    assert advances >= 1
    assert value(found, "ackgate.group.advance.duration").count == advances
    assert value(found, "ackgate.group.advanced_messages").value == stats.group.advanced_events
    assert stats.group.advance_calls == advances


class LaggingProducer(MemoryStreamProducer):
    """The memory producer with a broker lag to report, as an adapter measures it."""

    def broker_lag(self) -> BrokerLag:
        return BrokerLag(lanes={0: 7}, waiting=3, in_flight=2, measured_at=1.0)


async def test_the_oldest_message_is_named_in_labels_and_lag_is_recorded(
    broker: MemoryBroker, running: Any
) -> None:
    broker.create_topic("one-lane", 1)
    for n in range(3):
        broker.publish("one-lane", b"m%d" % n, key=f"customer-{n}")
    with otel_sdk() as (reader, _spans):
        service = Service("lagging", producer=lambda: LaggingProducer(broker, "one-lane", "g"))
        holding = asyncio.Event()
        release = asyncio.Event()

        @service.handler("fast")
        async def fast(message: Message) -> None:
            pass

        @service.handler("slow")
        async def slow(message: Message) -> None:
            holding.set()
            await release.wait()

        async with running(service):
            await asyncio.wait_for(holding.wait(), 10)
            found = points(reader, "lagging")
            release.set()
    (oldest,) = found["ackgate.group.oldest_message_age"]
    assert {k: v for k, v in oldest.attributes.items() if k != "ackgate.service"} == {
        "ackgate.lane": "0",
        "ackgate.message.key": "customer-0",
        "messaging.message.id": "one-lane/0/0",
        "ackgate.handlers": "slow",
    }
    assert oldest.value > 0
    assert value(found, "ackgate.handler.behind", **{"ackgate.handler": "slow"}).value == 3
    assert value(found, "ackgate.handler.behind", **{"ackgate.handler": "fast"}).value == 0
    assert value(found, "ackgate.group.lag", **{"ackgate.lane": "0"}).value == 7
    assert value(found, "ackgate.group.broker_messages", **{"ackgate.state": "waiting"}).value == 3
    assert (
        value(found, "ackgate.group.broker_messages", **{"ackgate.state": "in_flight"}).value == 2
    )


def test_no_sdk_no_instrumentation() -> None:
    """Without an SDK provider the services make no span and read no clock per call."""
    assert sdk_configured() == (False, False)


class TracedProducer(MemoryStreamProducer):
    """Memory records carry no headers: this one gives each message its record's
    ``traceparent`` as a header, the way each adapter maps its broker's place."""

    def __init__(self, broker: MemoryBroker, carriers: dict[bytes, dict[str, str]]) -> None:
        super().__init__(broker, "orders", "traced")
        self._carriers = carriers

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        message = super().to_message(raw_event, broker_payload)
        headers = {k: v.encode() for k, v in self._carriers.get(message.body, {}).items()}
        return Message(body=message.body, id=message.id, headers=headers, lane=message.lane)


async def test_handler_span_continues_the_trace_and_logs_carry_ids(
    broker: MemoryBroker, running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with otel_sdk() as (_reader, spans):
        tracer = trace.get_tracer("producer")
        carriers: dict[bytes, dict[str, str]] = {}
        with tracer.start_as_current_span("send orders", kind=trace.SpanKind.PRODUCER) as sent:
            carrier: dict[str, str] = {}
            inject(carrier)
        carriers[b"traced"] = carrier
        broker.publish("orders", b"traced")
        broker.publish("orders", b"untraced")
        service = Service("traced", producer=lambda: TracedProducer(broker, carriers))

        @service.handler("indexer")
        async def index(message: Message) -> None:
            logging.getLogger("app").info("indexing %s", message.id)

        caplog.set_level(logging.INFO, logger="app")
        # run() inside a span: a message without trace context still starts its own.
        with tracer.start_as_current_span("application"):
            async with running(service):
                await broker.wait_drained("orders", "traced")
        handler_spans = [s for s in spans.get_finished_spans() if s.name.startswith("process")]
    assert len(handler_spans) == 2
    traced = next(s for s in handler_spans if s.attributes["messaging.message.id"].endswith("/0"))
    sent_context = sent.get_span_context()
    assert traced.context.trace_id == sent_context.trace_id
    assert traced.parent is not None and traced.parent.span_id == sent_context.span_id
    assert traced.kind == trace.SpanKind.CONSUMER
    assert traced.attributes["ackgate.handler"] == "indexer"
    assert traced.attributes["messaging.system"] == "ackgate_memory"
    assert traced.attributes["messaging.destination.name"] == "orders"
    untraced = next(s for s in handler_spans if s is not traced)
    assert untraced.context.trace_id != sent_context.trace_id
    assert untraced.parent is None
    record = next(r for r in caplog.records if r.name == "app" and r.getMessage().endswith("/0"))
    assert record.otelTraceID == format(sent_context.trace_id, "032x")
    assert record.otelSpanID == format(traced.context.span_id, "016x")
