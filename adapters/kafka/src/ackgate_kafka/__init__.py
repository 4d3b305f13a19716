"""Apache Kafka adapter for ackgate: :class:`KafkaStreamProducer` on aiokafka.

The implementation and its full documentation (what each outcome does to the broker,
lanes, errors, logging) are in :mod:`ackgate_kafka._producer`.
"""

from ackgate_kafka._producer import KafkaStreamProducer

__all__ = [
    "KafkaStreamProducer",
]
