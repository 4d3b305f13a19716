"""What the project says stands on its own: the rules it keeps are written out in its
own docs (docs/internals.md indexes them), not cited from a document outside the
repository that nobody who clones it can read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The name of the outside contract document, spelled in two halves so that this file
#: does not cite it either (the check reads every tracked file, this one included).
OUTSIDE_DOCUMENT = "SP" + "EC"


def test_no_tracked_file_cites_a_document_outside_the_repository() -> None:
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    pattern = re.compile(rf"\b{OUTSIDE_DOCUMENT}\b" + "|\N{SECTION SIGN}")
    citations = []
    for name in filter(None, tracked):
        path = REPO / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        citations += [
            f"{name}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if pattern.search(line)
        ]
    assert citations == []
