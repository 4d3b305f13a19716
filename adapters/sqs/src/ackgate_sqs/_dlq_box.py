"""``ackgate dlq`` on SQS: the dead-letter queue's messages, received and held
invisible while the command runs (released again when it ends), and replays sent to
the source queue, then deleted from the DLQ.

The source is ``-o source_queue_url=URL``, else each dead letter's
``ackgate.original.queue`` attribute (written when the message had room for it: SQS
allows 10 attributes). A FIFO source gets the dead letter's group as its
``MessageGroupId`` and a deduplication id per replay. Registered as the ``sqs`` entry
of the ``ackgate.dead_letters`` group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ackgate import DeadLetter
from ackgate_sqs._dead_letter import ORIGINAL_QUEUE_ATTRIBUTE

#: Seconds a listed message stays invisible to others while the command runs.
_HOLD_SECONDS = 60

#: The ``-o`` options that go to aiobotocore's ``create_client``.
_CLIENT_OPTIONS = ("endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key")


def open_dead_letters(destination: str, options: Mapping[str, str]) -> SqsDeadLetters:
    """The ``ackgate.dead_letters`` entry: ``destination`` is the DLQ's URL; ``-o``
    options ``endpoint_url``, ``region_name`` and credentials reach the client,
    ``source_queue_url`` names where replays go."""
    unknown = set(options) - {*_CLIENT_OPTIONS, "source_queue_url"}
    if unknown:
        raise ValueError(f"sqs: unknown -o option(s) {sorted(unknown)}")
    client_args = {name: options[name] for name in _CLIENT_OPTIONS if name in options}
    return SqsDeadLetters(destination, client_args, options.get("source_queue_url"))


class SqsDeadLetters:
    """The dead-letter queue ``dlq_url``."""

    def __init__(self, dlq_url: str, client_args: Mapping[str, str], source: str | None) -> None:
        self.dlq_url = dlq_url
        self._client_args = dict(client_args)
        self._source = source
        self._context: Any = None
        self._client: Any = None
        #: Receipt handles of what :meth:`read` holds and :meth:`replay` did not delete.
        self._held: dict[str, str] = {}

    async def _sqs(self) -> Any:
        if self._client is None:
            try:
                from aiobotocore.session import get_session
            except ImportError as exc:
                raise ImportError(
                    "ackgate-sqs needs aiobotocore: pip install 'ackgate[sqs]'"
                ) from exc
            self._context = get_session().create_client("sqs", **self._client_args)
            self._client = await self._context.__aenter__()
        return self._client

    async def read(self) -> list[DeadLetter]:
        client = await self._sqs()
        letters: list[DeadLetter] = []
        while True:
            got = await client.receive_message(
                QueueUrl=self.dlq_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=_HOLD_SECONDS,
                MessageAttributeNames=["All"],
                AttributeNames=["All"],
            )
            messages = got.get("Messages", [])
            if not messages:
                return letters
            for message in messages:
                self._held[message["MessageId"]] = message["ReceiptHandle"]
                letters.append(self._letter(message))

    def _letter(self, message: dict[str, Any]) -> DeadLetter:
        attributes = message.get("MessageAttributes", {})
        group = message.get("Attributes", {}).get("MessageGroupId")
        origin = attributes.get(ORIGINAL_QUEUE_ATTRIBUTE, {}).get("StringValue", "")
        return DeadLetter.parse(
            id=str(message["MessageId"]),
            original_id=str(message["MessageId"]),
            source=self._source or origin,
            body=str(message.get("Body", "")).encode(),
            key=None if group is None else str(group).encode(),
            headers={name: _attribute_bytes(value) for name, value in attributes.items()},
            raw=message,
        )

    async def replay(self, letter: DeadLetter, headers: Mapping[str, bytes]) -> None:
        if not letter.source:
            raise ValueError(
                f"dead letter {letter.id}: no source queue; pass -o source_queue_url=URL"
            )
        client = await self._sqs()
        request: dict[str, Any] = {
            "QueueUrl": letter.source,
            "MessageBody": letter.body.decode(),
            "MessageAttributes": {name: _attribute(value) for name, value in headers.items()},
        }
        if letter.source.endswith(".fifo"):
            request["MessageGroupId"] = (letter.key or letter.original_id.encode()).decode()
            request["MessageDeduplicationId"] = f"{letter.id}-{letter.replayed + 1}"
        await client.send_message(**request)
        handle = self._held.pop(letter.id, None)
        if handle is not None:
            await client.delete_message(QueueUrl=self.dlq_url, ReceiptHandle=handle)

    async def aclose(self) -> None:
        """Make what was read and not replayed visible again, and close the client."""
        if self._client is None:
            return
        try:
            held = list(self._held.items())
            for start in range(0, len(held), 10):
                await self._client.change_message_visibility_batch(
                    QueueUrl=self.dlq_url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                        for n, (_, handle) in enumerate(held[start : start + 10])
                    ],
                )
        finally:
            self._held.clear()
            await self._context.__aexit__(None, None, None)
            self._client = self._context = None


def _attribute_bytes(value: dict[str, Any]) -> bytes:
    if str(value.get("DataType", "")).startswith("Binary"):
        return bytes(value.get("BinaryValue", b""))
    return str(value.get("StringValue", "")).encode()


def _attribute(value: bytes) -> dict[str, Any]:
    try:
        return {"DataType": "String", "StringValue": value.decode()}
    except UnicodeDecodeError:
        return {"DataType": "Binary", "BinaryValue": value}
