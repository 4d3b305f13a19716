"""What the docs say stands on its own: the README and docs/ are what users read, and
the contract they state is written out there, not cited from a file users never see."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_page_cites_the_internal_spec() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    citations = [
        f"{page.relative_to(REPO)}:{number}: {line.strip()}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\b", line)
    ]
    assert citations == []
