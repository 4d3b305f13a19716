"""``python -m ackgate.testing.brokers``: ``up`` starts a broker, prints the address and
stops on Ctrl-C; ``topic create`` and ``produce`` feed a Kafka topic; every flag has help.

Runs on the path ``ACKGATE_BROKERS`` picks (a local process by default, a container in
CI's container stage).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from ackgate.testing import brokers
from ackgate.testing._local import http_status, kafka_metadata_ok
from ackgate.testing.brokers import KafkaBroker, brokers_mode
from ackgate.testing.resources import unique

from .brokers_cli import owned_containers, start_up


def _answers(kind: str, exported: dict[str, str]) -> bool:
    if kind == "kafka":
        return asyncio.run(kafka_metadata_ok(exported["ACKGATE_KAFKA_BOOTSTRAP"]))
    return http_status(f"{exported['ACKGATE_SQS_ENDPOINT']}/") is not None


@pytest.mark.parametrize(
    ("kind", "stop"),
    [("kafka", signal.SIGINT), ("sqs", signal.SIGINT), ("sqs", signal.SIGTERM)],
    ids=["kafka-SIGINT", "sqs-SIGINT", "sqs-SIGTERM"],
)
def test_up_serves_until_interrupted_and_leaves_nothing(kind: str, stop: signal.Signals) -> None:
    process, exported = start_up(kind)
    try:
        assert _answers(kind, exported)
        process.send_signal(stop)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert not _answers(kind, exported)
    if brokers_mode() == "container":
        assert owned_containers(process.pid) == []


def _every_action(command: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_action(sub)
        else:
            yield command.prog, action


def test_every_flag_and_argument_has_help_text() -> None:
    missing = [
        f"{prog}: {action.option_strings or action.dest}"
        for prog, action in _every_action(brokers.parser())
        if not action.help
    ]
    assert missing == []


def test_topic_create_and_produce_with_keys(
    ackgate_kafka: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = unique()
    assert (
        brokers.main(
            ["topic", "create", topic, "--partitions", "3", "--bootstrap", ackgate_kafka.bootstrap]
        )
        == 0
    )
    lines = tmp_path / "orders.txt"
    lines.write_text('alice:{"n": 1}\nbob:{"n": 2}\nno key here\nalice:{"n": 3}\n')
    assert (
        brokers.main(
            [
                "produce",
                topic,
                str(lines),
                "--key-separator",
                ":",
                "--bootstrap",
                ackgate_kafka.bootstrap,
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        f"created topic {topic} with 3 partition(s) on {ackgate_kafka.bootstrap}",
        f"produced 4 record(s) to {topic} on {ackgate_kafka.bootstrap}",
    ]

    async def read() -> tuple[set[int], list[Any]]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=ackgate_kafka.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            records: list[Any] = []
            while len(records) < 4:
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    records += batch
            return consumer.partitions_for_topic(topic) or set(), records
        finally:
            await consumer.stop()

    partitions, records = asyncio.run(read())
    assert partitions == {0, 1, 2}
    by_key = {(r.key, r.value) for r in records}
    assert by_key == {
        (b"alice", b'{"n": 1}'),
        (b"bob", b'{"n": 2}'),
        (None, b"no key here"),
        (b"alice", b'{"n": 3}'),
    }
    alice = [r for r in records if r.key == b"alice"]
    assert [r.value for r in alice] == [b'{"n": 1}', b'{"n": 3}']  # one partition, in order


def test_produce_without_a_broker_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACKGATE_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(SystemExit) as exited:
        brokers.main(["produce", "orders"])
    assert "set ACKGATE_KAFKA_BOOTSTRAP" in str(exited.value.code)


def test_creating_a_topic_twice_is_one_line_and_exit_1(
    ackgate_kafka: KafkaBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, bootstrap = unique(), ackgate_kafka.bootstrap
    assert brokers.main(["topic", "create", topic, "--bootstrap", bootstrap]) == 0
    assert brokers.main(["topic", "create", topic, "--bootstrap", bootstrap]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m ackgate.testing.brokers topic: [Error 36] TopicAlreadyExists")
    assert len(err.splitlines()) == 1


def test_consume_prints_records_with_key_headers_offsets_and_offsets_prints_lag(
    ackgate_kafka: KafkaBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    from ackgate.testing import traffic
    from ackgate.testing.resources import KafkaFresh

    fresh = KafkaFresh(ackgate_kafka)
    bootstrap = ackgate_kafka.bootstrap

    async def setup() -> tuple[str, list[traffic.KafkaRecord]]:
        topic = await fresh.topic(partitions=1)
        await fresh.publish(
            topic,
            [traffic.Outgoing("one", key="k1", headers={"trace": "t1"}), "two", "three"],
        )
        return topic, await fresh.records(topic)

    topic, records = asyncio.run(setup())
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (0, b"k1", b"one", (("trace", b"t1"),)),
        (1, None, b"two", ()),
        (2, None, b"three", ()),
    ]
    group = unique("group")
    consume = ["consume", topic, "--from-beginning", "--bootstrap", bootstrap]
    assert brokers.main([*consume, "--max", "2", "--group", group]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{topic}/0/0 key=b'k1' headers=[trace=b't1'] value=b'one'",
        f"{topic}/0/1 key=None headers=[] value=b'two'",
    ]
    assert brokers.main(["offsets", group, topic, "--bootstrap", bootstrap]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == [topic, "0", "2", "3", "1"]  # committed 2 of 3: lag 1
    assert brokers.main([*consume, "--group", group]) == 0  # on from the group's offset
    assert capsys.readouterr().out.splitlines() == [
        f"{topic}/0/2 key=None headers=[] value=b'three'"
    ]
