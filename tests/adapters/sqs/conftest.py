"""A real SQS endpoint for the adapter tests.

moto's server (``python -m moto.server``) runs as a separate process on a free
127.0.0.1 port for the whole session, unless ``ACKGATE_SQS_ENDPOINT`` names a
running endpoint (LocalStack, ElasticMQ, ...). Dummy credentials are set for the
session. If the server cannot start, the session fails with its log tail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import get_session

REGION = "us-east-1"
_START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
            return True
    except (OSError, urllib.error.URLError):
        return False


def _tail(path: Path) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-30:])


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", REGION)
        env.delenv("AWS_PROFILE", raising=False)
        given = os.environ.get("ACKGATE_SQS_ENDPOINT")
        if given:
            yield given
            return
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp, "moto.log")
            with log.open("wb") as out:
                server = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                deadline = time.monotonic() + _START_TIMEOUT
                while not _ready(endpoint):
                    if server.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"moto server did not start on {endpoint}:\n{_tail(log)}")
                    time.sleep(0.1)
                yield endpoint
            finally:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


class SqsAdmin:
    """Test-side queue management and inspection through a plain aiobotocore client."""

    def __init__(self, client: Any, endpoint: str) -> None:
        self.client = client
        self.endpoint = endpoint

    async def create_queue(
        self,
        *,
        fifo: bool = False,
        dead_letter_to: str | None = None,
        max_receive_count: int = 2,
    ) -> str:
        name = f"ackgate-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        attributes: dict[str, str] = {}
        if fifo:
            attributes["FifoQueue"] = "true"
        if dead_letter_to is not None:
            arn = await self.attribute(dead_letter_to, "QueueArn")
            attributes["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receive_count)}
            )
        response = await self.client.create_queue(QueueName=name, Attributes=attributes)
        return str(response["QueueUrl"])

    async def attribute(self, url: str, name: str) -> str:
        response = await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=[name])
        return str(response["Attributes"][name])

    async def depth(self, url: str) -> int:
        """Messages in the queue, visible or in flight."""
        response = await self.client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        return sum(int(value) for value in response["Attributes"].values())

    async def send(
        self,
        url: str,
        bodies: Sequence[str],
        *,
        group: str | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> list[str]:
        """Send in batches of ten, in order; return the message ids."""
        ids: list[str] = []
        for start in range(0, len(bodies), 10):
            entries = []
            for index, body in enumerate(bodies[start : start + 10]):
                entry: dict[str, Any] = {"Id": str(index), "MessageBody": body}
                if group is not None:
                    entry["MessageGroupId"] = group
                    entry["MessageDeduplicationId"] = uuid.uuid4().hex
                if attributes:
                    entry["MessageAttributes"] = attributes
                entries.append(entry)
            response = await self.client.send_message_batch(QueueUrl=url, Entries=entries)
            assert not response.get("Failed"), response["Failed"]
            by_index = {int(ok["Id"]): ok["MessageId"] for ok in response["Successful"]}
            ids.extend(by_index[i] for i in sorted(by_index))
        return ids

    async def drain(self, url: str) -> list[dict[str, Any]]:
        """Receive (and delete) everything visible in ``url``."""
        messages: list[dict[str, Any]] = []
        while True:
            response = await self.client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
            )
            batch = response.get("Messages", [])
            if not batch:
                return messages
            messages.extend(batch)
            await self.client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
                ],
            )


@pytest.fixture
async def sqs(sqs_endpoint: str) -> AsyncIterator[SqsAdmin]:
    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=sqs_endpoint
    ) as client:
        yield SqsAdmin(client, sqs_endpoint)
