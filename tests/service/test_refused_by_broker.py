"""A broker that refuses the producer (credentials, TLS, access) is a permanent error
(docs/production.md#security): ``run()`` raises it at once, unless the service was made
with ``retry_on_auth_error``, which starts the group again at that interval, logs the
refusal once and shows it in ``ServiceStats.refused`` and ``/readyz``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ackgate import (
    AuthenticationFailed,
    Message,
    PermanentError,
    Service,
    TLSVerificationFailed,
)
from ackgate._operating.health import not_ready
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer

REFUSAL = "authentication failed for user alice (SCRAM-SHA-512)"


class Refused(MemoryStreamProducer):
    """Every stream is refused, as by a broker that does not take the credentials."""

    def __init__(self, *args: Any, error: PermanentError) -> None:
        super().__init__(*args)
        self._error = error

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        raise ConnectionError("Unable to bootstrap") from self._error
        yield  # an async generator, as the contract asks


def a_service(broker: MemoryBroker, refusals: list[PermanentError], **options: Any) -> Service:
    """A service whose first producers are refused with ``refusals``, the next ones not."""

    def make() -> MemoryStreamProducer:
        if refusals:
            return Refused(broker, "orders", "svc", error=refusals.pop(0))
        return MemoryStreamProducer(broker, "orders", "svc")

    service = Service("orders", producer=make, restart_backoff=0.0, **options)

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    return service


@pytest.mark.parametrize(
    "error",
    [
        AuthenticationFailed(REFUSAL, address="broker:9093"),
        TLSVerificationFailed("TLS: the broker's certificate is not trusted (...)"),
    ],
)
async def test_a_refusal_is_raised_by_run_without_a_restart(
    broker: MemoryBroker, error: PermanentError
) -> None:
    service = a_service(broker, [error])
    with pytest.raises(PermanentError) as raised:
        async with asyncio.timeout(10):
            await service.run()
    assert raised.value is error
    assert "the broker refused it, not retried" in raised.value.__notes__[-1]
    assert service.stats().restarts == 0


async def test_retry_on_auth_error_retries_logs_once_and_says_why_in_readyz(
    broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    refusals: list[PermanentError] = [AuthenticationFailed(REFUSAL) for _ in range(3)]
    service = a_service(broker, refusals, retry_on_auth_error=0.01)
    caplog.set_level(logging.WARNING, logger="ackgate")
    task = asyncio.create_task(service.run())
    seen_reasons = set()
    async with asyncio.timeout(10):
        while refusals or service.stats().group is None:
            if service.stats().refused is not None and service.stats().group is None:
                seen_reasons.update(problem["reason"] for problem in not_ready([service]))
            await asyncio.sleep(0)
    assert service.stats().restarts == 3
    assert service.stats().refused is None  # the group that came up was not refused
    assert not_ready([service]) == []
    await service.stop(5)
    await task
    lines = [r.getMessage() for r in caplog.records if REFUSAL in r.getMessage()]
    assert len(lines) == 1, lines
    assert "retrying every 0.01s (retry_on_auth_error)" in lines[0]
    assert seen_reasons == {f"the broker refused the service: {REFUSAL} (retrying)"}


@pytest.mark.parametrize("value", [0, -1, float("inf"), True, "30"])
def test_retry_on_auth_error_is_checked(broker: MemoryBroker, value: Any) -> None:
    with pytest.raises(ValueError, match="retry_on_auth_error must be a finite number > 0"):
        Service(
            "orders",
            producer=lambda: MemoryStreamProducer(broker, "o", "g"),
            retry_on_auth_error=value,
        )
