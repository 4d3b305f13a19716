"""The API reference documents every public name: each name in ``ackgate.__all__`` has
its ``::: ackgate.<name>`` entry in docs/reference/ackgate.md."""

from __future__ import annotations

from pathlib import Path

import ackgate

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "ackgate.md"


def test_every_public_name_is_in_the_reference() -> None:
    entries = {
        line.removeprefix("::: ackgate.").strip()
        for line in REFERENCE.read_text().splitlines()
        if line.startswith("::: ackgate.")
    }
    assert sorted(set(ackgate.__all__) - entries) == []
    assert sorted(entries - set(ackgate.__all__)) == []
