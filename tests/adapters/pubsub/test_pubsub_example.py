"""``examples/pubsub_service.py`` run by ``ackgate run`` against the Pub/Sub emulator."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from .pubsub_support import PubSubAdmin

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


async def test_the_pubsub_example_service_handles_everything_and_stops_cleanly(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic, ordering=True)
    bodies = [json.dumps({"n": n}) for n in range(5)]
    await pubsub.publish(topic, bodies, ordering_key="alice", attributes={"customer": "alice"})
    env = {**os.environ, "ACKGATE_PUBSUB_SUBSCRIPTION": subscription}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ackgate", "run", "pubsub_service:service",
        cwd=EXAMPLES, env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while len({line for line in lines if line.startswith(("indexed", "audited"))}) < 10 or (
                sum(int(line.split()[1]) for line in lines if line.startswith("counted")) < 5
            ):
                lines.append((await process.stdout.readline()).decode().strip())
    finally:
        process.send_signal(signal.SIGTERM)  # graceful: what was handled is acknowledged
        rest, _ = await process.communicate()
    lines.extend(rest.decode().split("\n"))
    assert process.returncode == 0
    indexed = [line.split()[1] for line in lines if line.startswith("indexed")]
    audited = [line.split()[1] for line in lines if line.startswith("audited")]
    assert len(set(indexed)) == 5 and sorted(indexed) == sorted(audited)
    assert sum(int(line.split()[1]) for line in lines if line.startswith("counted")) == 5
    # Longer than the subscription's 10 s deadline: anything not acknowledged is back.
    assert await pubsub.pull(subscription, wait=12) == []
