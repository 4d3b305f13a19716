"""``ackgate dlq`` on Kafka: a dead-letter topic read from its beginning to its end
offsets (no consumer group: reading commits nothing), and replays produced to each
record's original topic (its ``ackgate.original.topic`` header).

A Kafka topic is a log: a replayed record stays in the DLQ topic. A replayed copy
carries ``ackgate.replayed`` (the count) and ``ackgate.replay-of`` (the original id);
when it is rejected again, its new dead-letter record keeps both, so ``ackgate dlq``
shows it as a replay and does not pick it again unless asked (``--again``).
Registered as the ``kafka`` entry of the ``ackgate.dead_letters`` group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ackgate import DeadLetter
from ackgate_kafka._fetch import _import_aiokafka


def open_dead_letters(destination: str, options: Mapping[str, str]) -> KafkaDeadLetters:
    """The ``ackgate.dead_letters`` entry: ``-o bootstrap_servers=HOST:PORT`` is required."""
    servers = options.get("bootstrap_servers")
    if not servers:
        raise ValueError("kafka: pass -o bootstrap_servers=HOST:PORT")
    return KafkaDeadLetters(destination, servers)


class KafkaDeadLetters:
    """The dead-letter topic ``topic`` on ``bootstrap_servers``."""

    def __init__(self, topic: str, bootstrap_servers: str) -> None:
        self.topic = topic
        self._servers = bootstrap_servers
        self._producer: Any = None

    async def read(self) -> list[DeadLetter]:
        aiokafka = _import_aiokafka()
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=self._servers, enable_auto_commit=False, group_id=None
        )
        await consumer.start()
        try:
            partitions = consumer.partitions_for_topic(self.topic)
            if partitions is None:
                await consumer._client.force_metadata_update()
                partitions = consumer.partitions_for_topic(self.topic) or set()
            tps = [aiokafka.TopicPartition(self.topic, p) for p in sorted(partitions)]
            if not tps:
                raise LookupError(f"kafka: no topic {self.topic!r}")
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            await consumer.seek_to_beginning(*tps)
            records: list[Any] = []
            left = {tp for tp in tps if ends[tp] > await consumer.position(tp)}
            while left:
                fetched = await consumer.getmany(*left, timeout_ms=1000)
                for tp, batch in fetched.items():
                    records.extend(r for r in batch if r.offset < ends[tp])
                    if batch and batch[-1].offset + 1 >= ends[tp]:
                        left.discard(tp)
        finally:
            await consumer.stop()
        return [_letter(record) for record in records]

    async def replay(self, letter: DeadLetter, headers: Mapping[str, bytes]) -> None:
        if not letter.source:
            raise ValueError(f"dead letter {letter.id}: no ackgate.original.topic header")
        if self._producer is None:
            aiokafka = _import_aiokafka()
            self._producer = aiokafka.AIOKafkaProducer(bootstrap_servers=self._servers, acks="all")
            await self._producer.start()
        await self._producer.send_and_wait(
            letter.source, letter.body, key=letter.key, headers=list(headers.items())
        )

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


def _letter(record: Any) -> DeadLetter:
    origin = {
        name: value.decode(errors="replace")
        for name, value in record.headers or ()
        if name.startswith("ackgate.original.")
    }
    topic = origin.get("ackgate.original.topic", "")
    partition = origin.get("ackgate.original.partition")
    offset = origin.get("ackgate.original.offset")
    return DeadLetter.parse(
        id=f"{record.topic}/{record.partition}/{record.offset}",
        original_id=f"{topic}/{partition}/{offset}",
        source=topic,
        body=record.value if record.value is not None else b"",
        key=record.key,
        headers=record.headers or (),
        raw=record,
    )
