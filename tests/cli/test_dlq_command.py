"""docs/dead-letters.md without a broker: the reasons of a dead-letter record are read per
handler (Kafka's and SQS's forms), replay's filters, the replay headers, and the command
line's refusals (exit 2, one line)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import pytest

from ackgate import DeadLetter
from ackgate._contract.dead_letters import rejections
from ackgate._operating.cli import main
from ackgate._operating.dlq_command import chosen, groups


def test_rejections_are_read_per_handler_from_both_reason_forms() -> None:
    kafka = "rejected by 2 of 3 subscribers: store: bad row; notifier: gave up: X: a; b"
    sqs = "rejected by 1 of 2 subscribers; picky: gave up after 3 attempts: ValueError: bad"
    assert rejections(kafka) == (("store", "bad row"), ("notifier", "gave up: X: a; b"))
    assert rejections(sqs) == (("picky", "gave up after 3 attempts: ValueError: bad"),)
    assert rejections("rejected by 1 of 1 subscribers") == ()
    assert rejections("") == ()


def letter(id_: str, reason: str, **headers: bytes) -> DeadLetter:
    return DeadLetter.parse(
        id=id_,
        original_id=f"orders/0/{id_}",
        source="orders",
        body=b"x",
        key=None,
        headers=[("trace", b"t"), ("ackgate.reason", reason.encode()), *headers.items()],
    )


def test_replay_picks_by_id_reason_and_handler_and_leaves_replays_alone() -> None:
    letters = [
        letter("1", "rejected by 1 of 2 subscribers: a: timeout"),
        letter("2", "rejected by 1 of 2 subscribers: b: timeout"),
        letter("3", "rejected by 1 of 2 subscribers: a: bad", **{"ackgate.replayed": b"1"}),
    ]
    assert letters[2].replayed == 1 and letters[0].headers == {"trace": b"t"}

    def pick(**given: object) -> list[str]:
        opts = argparse.Namespace(ids=[], reason=None, handler=None, again=False)
        vars(opts).update(given)
        return [x.id for x in chosen(letters, opts)]

    assert pick(handler="a") == ["1"]
    assert pick(handler="a", again=True) == ["1", "3"]
    assert pick(reason="timeout") == ["1", "2"]
    assert pick(ids=["orders/0/2"]) == ["2"]
    assert groups(letters)[("a", "timeout")] == 1
    assert letters[0].replay_headers("a") == {
        "trace": b"t",
        "ackgate.replay-of": b"orders/0/1",
        "ackgate.replayed": b"1",
        "ackgate.replay-to": b"a",
    }
    assert "ackgate.replay-to" not in letters[0].replay_headers(None)
    assert letters[0].replay_headers(None, "orders")["ackgate.replay-service"] == b"orders"


def test_an_unknown_broker_or_a_replay_without_a_choice_is_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["dlq", "list", "nosuch", "dlq"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ackgate dlq: no adapter reads 'nosuch' dead letters (installed: ")
    assert "kafka" in err and "sqs" in err
    assert main(["dlq", "replay", "kafka", "dlq", "-o", "bootstrap_servers=x:1"]) == 2
    assert "choose with --id, --reason, --handler, or --all" in capsys.readouterr().err
    assert main(["dlq", "list", "kafka", "dlq"]) == 2
    assert "pass -o bootstrap_servers=HOST:PORT" in capsys.readouterr().err


class FakeBox:
    """A dead-letter destination in memory: what ``replay`` sent, with which headers."""

    def __init__(self, letters: list[DeadLetter]) -> None:
        self.letters = letters
        self.sent: list[tuple[str, dict[str, bytes]]] = []
        self.closed = False

    async def read(self) -> list[DeadLetter]:
        return list(self.letters)

    async def replay(self, letter: DeadLetter, headers: Mapping[str, bytes]) -> None:
        self.sent.append((letter.id, dict(headers)))

    async def aclose(self) -> None:
        self.closed = True


def test_a_long_replay_shows_progress_without_rich_and_ends_with_a_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ackgate._operating.dlq_command as dlq_module

    reason = "rejected by 1 of 2 subscribers: mailer: gave up after 3 attempts: E: down"
    box = FakeBox([letter(str(n), reason) for n in range(40)])
    box.letters.append(letter("40", reason, **{"ackgate.replayed": b"2"}))
    monkeypatch.setattr(dlq_module, "_opener", lambda broker: lambda dest, options: box)

    assert main(["dlq", "replay", "fake", "dlq", "--handler", "mailer", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert box.sent == [] and len(out) == 41 and box.closed
    assert out[-1] == (
        "dry run: 40 of 41 dead letters would be replayed to the source; "
        "1 replays already left alone"
    )
    assert main(["dlq", "replay", "fake", "dlq", "--all", "--to-handler", "mailer"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("replayed ") and "/" in line] == [
        f"replayed {n}/40" for n in range(4, 41, 4)
    ]
    assert out[-1] == (
        "replayed 40 of 41 dead letters to handler 'mailer' only; "
        "1 replays already left alone (--again picks them)"
    )
    assert len(box.sent) == 40
    assert all(headers["ackgate.replay-to"] == b"mailer" for _, headers in box.sent)
