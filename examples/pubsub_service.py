"""An ackgate Service on Google Cloud Pub/Sub: every message goes to three handlers,
and it is acknowledged only once all three are done with it.

Configured from the environment:

* ``ACKGATE_PUBSUB_SUBSCRIPTION`` (required): ``projects/P/subscriptions/S``.
* ``PUBSUB_EMULATOR_HOST``: the emulator's ``host:port``; unset for Google Cloud
  (credentials then come the usual Google ways).
* ``ACKGATE_PUBSUB_DLQ_TOPIC``: ``projects/P/topics/T`` where rejected messages go,
  with the reasons; unset to leave them to the subscription's dead-letter policy.

Run it from this directory (the current directory is importable)::

    ACKGATE_PUBSUB_SUBSCRIPTION=... ackgate run pubsub_service:service

SIGTERM or Ctrl-C stops it gracefully: what was handled is acknowledged, the rest is
nacked and redelivered.
"""

import json
import os
from collections import Counter

from ackgate import Message, Reject, Retry, Service
from ackgate_pubsub import PubSubStreamProducer

SUBSCRIPTION = os.environ.get("ACKGATE_PUBSUB_SUBSCRIPTION", "")


def make_producer() -> PubSubStreamProducer:
    return PubSubStreamProducer(
        SUBSCRIPTION,
        dlq_topic=os.environ.get("ACKGATE_PUBSUB_DLQ_TOPIC") or None,
        ack_deadline=30,
    )


service = Service("pubsub-orders", producer=make_producer, max_concurrent_advances=8)
by_customer: Counter[str] = Counter()


@service.handler("indexer", concurrency=8, ordering="key", retry=Retry(attempts=3))
async def index(message: Message) -> None:
    # ordering="key": one message at a time per ordering key, up to 8 at once.
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
        by_customer[message.headers.get("customer", b"?").decode()] += 1
    print(f"counted {len(messages)}", flush=True)
