"""docs/production.md#watching-it traces on genuine Kafka: a producer writes ``traceparent`` as a
record header; the Service handler's span continues that trace (same trace id, the producer's span
its parent) and a log record written inside the handler carries both ids."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from ackgate_kafka import KafkaStreamProducer
from ackgate_test_support.otel import trace_through

from .kafka_testlib import KafkaTestCluster


async def test_handler_span_continues_the_record_header_traceparent(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("traced"), kafka.unique("g")
    await kafka.create_topic(topic, 1)

    async def send(carrier: dict[str, str]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
        await producer.start()
        try:
            headers = [(name, value.encode()) for name, value in carrier.items()]
            await producer.send_and_wait(topic, b"traced", headers=headers)
        finally:
            await producer.stop()

    await trace_through(
        lambda: KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group),
        send,
        "kafka",
    )
