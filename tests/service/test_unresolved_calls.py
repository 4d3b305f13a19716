"""The process-local memory behind ``give_up_after``'s rule for messages handed past
the limit: earlier deliveries before this process saw a message count as calls that
never resolved, later ones only when a call was cut short; forgotten ids count as
never seen (the worst case), never as resolved."""

from __future__ import annotations

import pytest

from ackgate import Message
from ackgate._service import unresolved as unresolved_module
from ackgate._service.unresolved import UnresolvedCalls


def message(id: str, attempt: int) -> Message:
    return Message(body=b"", id=id, attempt=attempt)


def test_deliveries_before_the_process_count_and_later_only_calls_cut_short() -> None:
    calls = UnresolvedCalls()
    calls.seen(message("x", 3))  # delivered twice before this process saw it
    calls.seen(message("x", 4))  # redelivered: it waited in a dropped queue
    assert calls.count("h", message("x", 5)) == 2
    calls.cut_short("h", message("x", 5))
    assert calls.count("h", message("x", 6)) == 3
    assert calls.count("other", message("x", 6)) == 2  # per handler


def test_forgotten_ids_count_every_earlier_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unresolved_module, "_REMEMBERED", 2)
    calls = UnresolvedCalls()
    for n in range(5):  # past 2 * _REMEMBERED: the oldest are dropped in one step
        calls.seen(message(f"m{n}", 1))
    assert calls.count("h", message("m0", 4)) == 3  # forgotten: seen first now
    assert calls.count("h", message("m4", 4)) == 0  # remembered: seen at attempt 1
