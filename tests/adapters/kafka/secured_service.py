"""A two-handler ``ackgate.Service`` over the SASL_SSL listener, for ``ackgate run``
in test_kafka_security.py. Configured by environment variables:

``SECURED_BOOTSTRAP``, ``SECURED_TOPIC``, ``SECURED_GROUP``, ``SECURED_DLQ``,
``SECURED_MECHANISM``, ``SECURED_PASSWORD``, ``SECURED_CAFILE``, and
``SECURED_EXTRA_OPTION`` (``name=value``, passed through as one more consumer option).

``auditor`` rejects every message whose body starts with ``b"bad"``; ``logger`` acks
all and logs each message id at DEBUG on its own logger.
"""

from __future__ import annotations

import logging
import os
import ssl

from ackgate import Message, Reject, Service
from ackgate_kafka import KafkaStreamProducer

log = logging.getLogger("secured_service")


def make() -> KafkaStreamProducer:
    env = os.environ
    extra = {}
    if env.get("SECURED_EXTRA_OPTION"):
        name, _, value = env["SECURED_EXTRA_OPTION"].partition("=")
        extra[name] = value
    return KafkaStreamProducer(
        env["SECURED_TOPIC"],
        bootstrap_servers=env["SECURED_BOOTSTRAP"],
        group_id=env["SECURED_GROUP"],
        dlq_topic=env["SECURED_DLQ"],
        security_protocol="SASL_SSL",
        sasl_mechanism=env["SECURED_MECHANISM"],
        sasl_plain_username="alice",
        sasl_plain_password=env["SECURED_PASSWORD"],
        ssl_context=ssl.create_default_context(cafile=env["SECURED_CAFILE"]),
        **extra,
    )


service = Service("secured", producer=make)


@service.handler("auditor")
async def audit(message: Message) -> None:
    if message.body.startswith(b"bad"):
        raise Reject("bad body")


@service.handler("logger")
async def log_it(message: Message) -> None:
    log.debug("handled %s", message.id)
