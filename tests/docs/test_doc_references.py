"""Every reference to a docs page in the repository leads somewhere.

Code comments, docstrings, tests and the CHANGELOG cite the page that states a rule
as ``docs/<page>.md#<anchor>``. mkdocs checks the links between the docs pages
(``validation.anchors`` in mkdocs.yml, strict build), but not these: here every one
in a tracked file must name a page under ``docs/`` with a heading whose anchor is
``<anchor>``, computed the way the site's table of contents computes it. And every
test a file names as ``tests/<path>.py::<test>`` (docs/internals.md lists the tests
of each invariant) must be defined in that file.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

DOC_REFERENCE = re.compile(r"\bdocs/([a-z0-9_/-]+\.md)#([a-z0-9_-]+)")
TEST_REFERENCE = re.compile(r"\b(tests/[A-Za-z0-9_/]+\.py)::([A-Za-z_][A-Za-z0-9_]*)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
EXPLICIT_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}\s*$")


@cache
def tracked_texts() -> dict[str, str]:
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    texts = {}
    for name in filter(None, names):
        try:
            texts[name] = (REPO / name).read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
    return texts


def slug(heading: str) -> str:
    """The anchor the site gives a Markdown heading: its text as rendered (code spans
    keep their content, links their text, emphasis and tags go), then the toc rule:
    ASCII, lowercase, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\](?:\([^)]*\)|\[[^\]]*\])", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings (fenced code is not a heading; a repeated
    anchor gets ``_1``, ``_2``, ... as on the site; ``{#id}`` sets one)."""
    found: set[str] = set()
    fence: str | None = None
    for line in markdown.splitlines():
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            continue
        if opening:
            fence = opening.group(1)
            continue
        heading = HEADING.match(line)
        if heading is None:
            continue
        text = heading.group(2)
        explicit = EXPLICIT_ID.search(text)
        if explicit:
            found.add(explicit.group(1))
            continue
        anchor = base = slug(text)
        count = 0
        while anchor in found:
            count += 1
            anchor = f"{base}_{count}"
        found.add(anchor)
    return found


@cache
def page_anchors(page: str) -> set[str] | None:
    path = DOCS / page
    return anchors(path.read_text()) if path.is_file() else None


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("`Service` options", "service-options"),
        ("`max_outstanding`", "max_outstanding"),
        ("1. The producer", "1-the-producer"),
        ("Memory (`ackgate.adapters.memory`)", "memory-ackgateadaptersmemory"),
        ("Probes: `--health-port`", "probes-health-port"),
        ("Without OpenTelemetry: `stats()`", "without-opentelemetry-stats"),
        ("Google Pub/Sub (`ackgate_pubsub`)", "google-pubsub-ackgate_pubsub"),
        ("The [guarantee](concepts.md#the-guarantee), **plainly**", "the-guarantee-plainly"),
    ],
)
def test_anchors_are_computed_as_the_site_computes_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_fenced_code_is_no_heading_and_repeated_headings_are_numbered() -> None:
    page = "# Title\n\n```python\n# not a heading\n```\n\n## Alerts\n\n## Alerts\n\n## My {#mine}\n"
    assert anchors(page) == {"title", "alerts", "alerts_1", "mine"}


def test_every_docs_reference_names_an_existing_heading() -> None:
    references = {
        (name, page, anchor)
        for name, text in tracked_texts().items()
        for page, anchor in DOC_REFERENCE.findall(text)
    }
    assert references, "the pattern finds the references the code makes"
    broken = sorted(
        f"{name}: docs/{page}#{anchor}"
        + (" (no such page)" if page_anchors(page) is None else " (no such heading)")
        for name, page, anchor in references
        if anchor not in (page_anchors(page) or set())
    )
    assert broken == []


def test_every_test_named_by_path_exists() -> None:
    texts = tracked_texts()
    references = {
        (name, path, test)
        for name, text in texts.items()
        for path, test in TEST_REFERENCE.findall(text)
    }
    assert references, "docs/internals.md names the tests of each invariant"

    def defined(path: str, test: str) -> bool:
        source = texts.get(path)
        return source is not None and bool(
            re.search(rf"^(?:async def|def|class) {test}\b|^{test} = ", source, re.MULTILINE)
        )

    missing = sorted(
        f"{name}: {path}::{test}" for name, path, test in references if not defined(path, test)
    )
    assert missing == []
