"""docs/production.md#watching-it traces on SQS: ``traceparent`` as a message attribute; the
handler's span continues the producer's trace and logs inside it carry the ids."""

from __future__ import annotations

from ackgate_sqs import SqsStreamProducer
from ackgate_test_support.otel import trace_through

from .sqs_support import REGION, SqsAdmin


async def test_handler_span_continues_the_message_attribute_traceparent(sqs: SqsAdmin) -> None:
    url = await sqs.create_queue()

    async def send(carrier: dict[str, str]) -> None:
        attributes = {k: {"DataType": "String", "StringValue": v} for k, v in carrier.items()}
        await sqs.send(url, ["traced"], attributes=attributes)

    await trace_through(
        lambda: SqsStreamProducer(
            url, region_name=REGION, endpoint_url=sqs.endpoint, wait_time_seconds=1
        ),
        send,
        "aws_sqs",
    )
