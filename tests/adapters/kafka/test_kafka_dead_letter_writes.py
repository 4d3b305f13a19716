"""The Kafka DLQ writes (``ackgate_kafka._dead_letter``) without a broker: a rejected record is
written once per process however often it is fetched again (a hold or a rebalance rewound its
partition), a record the DLQ producer refuses for its size becomes a stub, and a refusal no retry
mends is a ``PermanentError``. The same paths on genuine Kafka are in
``test_kafka_failure_isolation.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiokafka.errors
import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from ackgate import AdvanceOutcome, PermanentError
from ackgate_kafka import KafkaStreamProducer
from ackgate_kafka._advance import AdvancePlan
from ackgate_kafka._partitions import Delivery

TP = TopicPartition("orders", 0)
OUTCOME = AdvanceOutcome(acked=1, failed=0, rejected=1, reasons=("picky: torn",))


class FakeDlq:
    """``AIOKafkaProducer.send`` as the DLQ writer uses it: each call queues a write and
    returns its acknowledgement future; ``refuse`` decides per value what it raises."""

    def __init__(self, refuse: Callable[[bytes], BaseException | None] = lambda value: None):
        self.sent: list[tuple[bytes, list[tuple[str, bytes]]]] = []
        self._refuse = refuse

    async def send(self, topic: str, *, value: bytes, key: Any = None, headers: Any) -> Any:
        error = self._refuse(value)
        if error is not None:
            raise error
        self.sent.append((value, headers))
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def producer(dlq: FakeDlq, group: str) -> KafkaStreamProducer:
    made = KafkaStreamProducer(
        "orders", bootstrap_servers="localhost:1", group_id=group, dlq_topic="orders.dlq"
    )
    made._dlq = dlq
    made._errors = aiokafka.errors
    return made


def rejected(offset: int, value: bytes) -> AdvancePlan:
    record = ConsumerRecord(
        "orders", 0, offset, 0, 0, None, value, None, len(value), 0, [("trace", b"t")]
    )
    return AdvancePlan(rejected=[(Delivery(TP, record, 1, 1), OUTCOME)])


async def test_a_record_fetched_again_is_written_once_per_process() -> None:
    dlq = FakeDlq()
    first = producer(dlq, "once-g")
    await first._dead_letter_all(TP, rejected(5, b"row"))
    await first._dead_letter_all(TP, rejected(5, b"row"))  # fetched again after a rewind
    # A later group life of the same service (a new producer) remembers it too.
    await producer(dlq, "once-g")._dead_letter_all(TP, rejected(5, b"row"))
    await first._dead_letter_all(TP, rejected(6, b"other"))
    assert [value for value, _ in dlq.sent] == [b"row", b"other"]


async def test_a_record_too_large_for_the_dlq_producer_becomes_a_stub() -> None:
    dlq = FakeDlq(
        lambda value: (
            aiokafka.errors.MessageSizeTooLargeError("too big") if len(value) > 1000 else None
        )
    )
    await producer(dlq, "stub-g")._dead_letter_all(TP, rejected(9, b"x" * 5000))
    ((value, headers),) = dlq.sent
    stub = json.loads(value)
    assert (stub["topic"], stub["partition"], stub["offset"]) == ("orders", 0, 9)
    assert stub["size"] == 5000 + len("trace") + 1
    assert stub["reason"] == "rejected by 1 of 2 subscribers: picky: torn"
    assert dict(headers)["ackgate.stub"] == b"5006"
    assert dict(headers)["ackgate.original.offset"] == b"9"


@pytest.mark.parametrize(
    "error",
    [
        aiokafka.errors.TopicAuthorizationFailedError("orders.dlq"),
        aiokafka.errors.UnknownTopicOrPartitionError(),
    ],
)
async def test_a_dlq_refused_for_good_is_a_permanent_error(error: BaseException) -> None:
    with pytest.raises(PermanentError, match=r"'orders\.dlq' refuses writes for good"):
        await producer(FakeDlq(lambda value: error), "refused-g")._dead_letter_all(
            TP, rejected(1, b"row")
        )


async def test_other_dlq_errors_end_the_group_as_before() -> None:
    dlq = FakeDlq(lambda value: aiokafka.errors.KafkaTimeoutError())
    with pytest.raises(RuntimeError, match="DLQ write failed"):
        await producer(dlq, "timeout-g")._dead_letter_all(TP, rejected(1, b"row"))
