"""Queue management and inspection for the SQS adapter tests (imported relatively:
``from .sqs_support import ...``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

REGION = "us-east-1"


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

    async def drain(self, url: str, *, wait: int = 0, once: bool = False) -> list[dict[str, Any]]:
        """Receive and delete until a receive (long-polling ``wait`` s) comes back empty.

        ``once``: stop after the first receive call.
        """
        messages: list[dict[str, Any]] = []
        while True:
            response = await self.client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=wait,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
            )
            batch = response.get("Messages", [])
            if batch:
                messages.extend(batch)
                await self.client.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(batch)
                    ],
                )
            if once or not batch:
                return messages
