"""A user's project outside this repository, run by pytest in a subprocess with nothing
of ``tests/`` (rootdir and cwd ``tmp_path``, no conftest, no ``pythonpath``): the
complete project of docs/testing.md (its files are the page's code blocks with a
``title``), and a test file that uses the plugin's fixtures and the conformance kit.

Runs on the path ``ACKGATE_BROKERS`` picks: local processes by default, containers in
CI's container stage; the user's test prints where its brokers came from.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from ackgate.testing.brokers import brokers_mode

from .brokers_cli import clean_env

USER_TEST = '''
import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from ackgate.testing.conformance import BrokerHarness, ConformanceSuite
from ackgate_sqs import SqsStreamProducer


def test_a_fresh_kafka_topic_round_trips(ackgate_kafka, ackgate_kafka_fresh):
    print("ORIGIN kafka", ackgate_kafka.origin)

    async def round_trip():
        topic = await ackgate_kafka_fresh.topic(partitions=2)
        producer = AIOKafkaProducer(bootstrap_servers=ackgate_kafka.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"hello")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=ackgate_kafka.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            return (await asyncio.wait_for(consumer.getone(), 30)).value
        finally:
            await consumer.stop()

    assert asyncio.run(round_trip()) == b"hello"


class Harness(BrokerHarness):
    """The SQS adapter over FIFO queues, written from the kit's documentation only."""

    def __init__(self, fresh):
        self.fresh = fresh

    async def setup(self):
        self.dlq = await self.fresh.queue(fifo=True)
        self.url = await self.fresh.queue(fifo=True)

    async def _call(self, name, **kwargs):
        async with self.fresh.client() as client:
            return await getattr(client, name)(**kwargs)

    async def publish(self, messages):
        for n, (lane, body) in enumerate(messages):
            await self._call("send_message", QueueUrl=self.url, MessageBody=body,
                             MessageGroupId=lane, MessageDeduplicationId=str(n))

    def producer(self):
        broker = self.fresh.broker
        return SqsStreamProducer(self.url, region_name=broker.region_name,
                                 endpoint_url=broker.endpoint_url, wait_time_seconds=1,
                                 dlq_queue_url=self.dlq)

    def body(self, raw: Any) -> str:
        return raw["Body"]

    async def _depth(self, url):
        got = await self._call("get_queue_attributes", QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
        return sum(int(v) for v in got["Attributes"].values())

    async def wait_fully_advanced(self):
        while await self._depth(self.url):
            await asyncio.sleep(0.1)

    async def unadvanced(self):
        return await self._depth(self.url)

    async def dead_lettered(self, count):
        bodies = []
        while len(bodies) < count:
            got = await self._call("receive_message", QueueUrl=self.dlq,
                                   MaxNumberOfMessages=10, WaitTimeSeconds=1)
            bodies += [m["Body"] for m in got.get("Messages", [])]
        return bodies


class TestMySqsAdapter(ConformanceSuite):
    @pytest.fixture
    def harness(self, ackgate_sqs, ackgate_sqs_fresh):
        print("ORIGIN sqs", ackgate_sqs.origin)
        return Harness(ackgate_sqs_fresh)
'''


TESTING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
TITLED_BLOCK = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)


def test_the_project_of_the_testing_page_passes(tmp_path: Path) -> None:
    """Strict asyncio mode (no configuration) and every warning an error."""
    files = dict(TITLED_BLOCK.findall(TESTING_PAGE.read_text()))
    assert sorted(files) == ["orders.py", "pyproject.toml", "test_orders.py"]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    output = run_pytest(tmp_path)
    assert "2 passed" in output, output
    assert "warnings summary" not in output, output


def test_a_user_project_uses_the_fixtures_and_the_conformance_kit(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    output = run_pytest(tmp_path, "-s", "test_user.py")
    assert "7 passed" in output, output
    origins = {line.split()[2] for line in output.splitlines() if line.startswith("ORIGIN ")}
    mode = brokers_mode()
    expected = {"container"} if mode == "container" else {"local"} if mode == "local" else None
    assert expected is None or origins == expected, output


def run_pytest(project: Path, *args: str) -> str:
    """pytest in ``project`` as a user runs it; its output, once it exited 0."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(project),
            "-q",
            "-rA",
            *args,
        ],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output
