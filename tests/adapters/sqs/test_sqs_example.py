"""``examples/sqs_service.py`` run by ``ackgate run`` against the test SQS server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from .sqs_support import SqsAdmin

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


async def test_the_sqs_example_service_handles_everything_and_stops_cleanly(
    sqs: SqsAdmin,
) -> None:
    url = await sqs.create_queue()
    customer = {"customer": {"DataType": "String", "StringValue": "alice"}}
    ids = await sqs.send(url, [json.dumps({"n": n}) for n in range(5)], attributes=customer)
    env = {**os.environ, "ACKGATE_SQS_ENDPOINT": sqs.endpoint, "ACKGATE_SQS_QUEUE_URL": url}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ackgate", "run", "sqs_service:service",
        cwd=EXAMPLES, env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while sum(int(line.split()[1]) for line in lines if line.startswith("counted")) < 5:
                lines.append((await process.stdout.readline()).decode().strip())
            while True:  # until every message is deleted: all three handlers were done
                if await sqs.depth(url) == 0:
                    break
                await asyncio.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = await process.communicate()
    lines.extend(rest.decode().split("\n"))
    assert process.returncode == 0
    assert sorted(line.split()[1] for line in lines if line.startswith("indexed")) == sorted(ids)
    assert {line.split()[2] for line in lines if line.startswith("indexed")} == {"attempt=1"}
    assert sorted(line.split()[1] for line in lines if line.startswith("audited")) == sorted(ids)
