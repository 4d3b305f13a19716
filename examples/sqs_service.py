"""An ackgate Service on Amazon SQS: every message goes to three handlers, and it is
deleted from the queue only once all three are done with it.

Configured from the environment:

* ``ACKGATE_SQS_QUEUE_URL`` (required): the queue to read.
* ``ACKGATE_SQS_ENDPOINT``: an SQS-compatible endpoint (moto, LocalStack, ElasticMQ);
  unset for AWS itself.
* ``ACKGATE_SQS_DLQ_URL``: where rejected messages go, with the reasons; unset to leave
  them to the queue's own redrive policy.
* ``AWS_REGION`` (default ``us-east-1``) and the usual botocore credentials.

Run it from this directory (the current directory is importable)::

    ACKGATE_SQS_QUEUE_URL=... ackgate run sqs_service:service

SIGTERM or Ctrl-C stops it gracefully: what was handled is deleted, the rest is left to
SQS to redeliver.
"""

import json
import os
from collections import Counter

from ackgate import Message, Reject, Retry, Service
from ackgate_sqs import SqsStreamProducer

QUEUE_URL = os.environ.get("ACKGATE_SQS_QUEUE_URL", "")


def make_producer() -> SqsStreamProducer:
    return SqsStreamProducer(
        QUEUE_URL,
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        endpoint_url=os.environ.get("ACKGATE_SQS_ENDPOINT") or None,
        dlq_queue_url=os.environ.get("ACKGATE_SQS_DLQ_URL") or None,
        wait_time_seconds=5,
    )


# Ten deletes can share one request when ten messages are advanced at once.
service = Service("sqs-orders", producer=make_producer, max_concurrent_advances=10)
by_customer: Counter[str] = Counter()


@service.handler("indexer", concurrency=8, ordering="key", retry=Retry(attempts=3))
async def index(message: Message) -> None:
    # ordering="key": one message at a time per FIFO message group, up to 8 at once.
    print(f"indexed {message.id} attempt={message.attempt}", flush=True)


@service.handler("auditor")
async def audit(message: Message) -> None:
    try:
        json.loads(message.body)
    except ValueError:
        raise Reject("not JSON") from None  # dead-lettered, never retried
    print(f"audited {message.id}", flush=True)


@service.handler("stats", batch_size=100, batch_wait=0.2)
async def count(messages: list[Message]) -> None:
    for message in messages:
        customer = message.headers.get("customer", b"?").decode()
        by_customer[customer] += 1
    print(f"counted {len(messages)}", flush=True)
