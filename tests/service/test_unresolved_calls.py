"""The process-local memory behind a handler's own ``Message.attempt``: deliveries
before this process saw a message count as calls that never resolved, later ones
only when this handler's hand-out failed or was cut short (never another handler's,
never a delivery that waited in a queue); forgotten ids count from the broker's
attempt again, never as resolved."""

from __future__ import annotations

import pytest

from ackgate import Message
from ackgate._service import unresolved as unresolved_module
from ackgate._service.unresolved import UnresolvedCalls


def message(id: str, attempt: int | None) -> Message:
    return Message(body=b"", id=id, attempt=attempt)


def test_deliveries_before_the_process_count_and_later_only_hand_outs_ended_unresolved() -> None:
    calls = UnresolvedCalls()
    calls.seen(message("x", 3))  # delivered twice before this process saw it
    calls.seen(message("x", 4))  # redelivered: it waited in a dropped queue
    assert calls.attempt("h", message("x", 5)) == 3
    calls.ended_unresolved("h", message("x", 5))
    assert calls.attempt("h", message("x", 6)) == 4
    assert calls.attempt("other", message("x", 6)) == 3  # per handler


def test_a_producer_without_attempts_gets_none() -> None:
    calls = UnresolvedCalls()
    calls.seen(message("x", None))
    calls.ended_unresolved("h", message("x", None))
    assert calls.attempt("h", message("x", None)) is None


def test_forgotten_ids_count_from_the_brokers_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unresolved_module, "_REMEMBERED", 2)
    calls = UnresolvedCalls()
    for n in range(5):  # past 2 * _REMEMBERED: the oldest are dropped in one step
        calls.seen(message(f"m{n}", 1))
    assert calls.attempt("h", message("m0", 4)) == 4  # forgotten: seen first now
    assert calls.attempt("h", message("m4", 4)) == 1  # remembered: seen at attempt 1
