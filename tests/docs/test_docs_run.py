"""Every code block of the README and docs/ runs here, or is marked with the reason it
does not.

Sybil (https://sybil.readthedocs.io) reads the pages: it is maintained, lexes Markdown
fenced blocks and HTML-comment directives without a renderer, and keeps one namespace
per page, so a page's blocks can build on each other as a reader's session does. Its
``<!-- skip: next "reason" -->`` comment is invisible on the rendered site.

* A ``python`` block is executed; an ``async def test_*`` it defines is then run, so a
  test shown on a page is a test here. ``--8<-- "path"`` (pymdownx.snippets) is
  replaced by the file, as the site does.
* Any other block (``bash``, ``console``, ``toml``, a ``python`` block with a title)
  must be preceded by a skip comment whose reason says where it really runs (a test, a
  CI stage) or why it cannot (a cloud account). ``mermaid`` and ``text`` blocks are
  pictures and output, not code.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path
from typing import Any
from unittest import SkipTest

import pytest
from sybil import Example, Region, Sybil
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
NOT_CODE = {"mermaid", "text"}
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)
SKIP = re.compile(r"<!--\s*skip:\s*(\w+)(.*?)-->")


def run_block(example: Example) -> None:
    info = example.parsed["info"].strip()
    language = info.split()[0]
    if language in NOT_CODE:
        return
    if info != "python":
        raise AssertionError(
            f"a {info!r} block that is not run here: precede it with "
            '<!-- skip: next "where it runs, or why it cannot" -->'
        )
    source = SNIPPET.sub(lambda m: (REPO / m.group(1)).read_text(), str(example.parsed["source"]))
    namespace: dict[str, Any] = example.namespace
    before = set(namespace)
    code = compile(source, f"{example.path}:{example.line}", "exec")
    exec(code, namespace)
    for name in [n for n in namespace if n not in before and n.startswith("test_")]:
        test = namespace[name]
        if inspect.iscoroutinefunction(test):
            asyncio.run(test())
        elif callable(test):
            test()


def fenced_blocks(document: Any) -> Any:
    lexer = FencedCodeBlockLexer(language=r".+", mapping={"language": "info", "source": "source"})
    for region in lexer(document):
        yield Region(region.start, region.end, region.lexemes, run_block)


DOCS = Sybil(parsers=[fenced_blocks, SkipParser()])


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_block_runs_or_says_why_not(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the pages' paths are the repository's
    document = DOCS.parse(page)
    failures = []
    for example in document:
        try:
            example.evaluate()
        except SkipTest:
            continue
        except Exception as exc:  # every block's failure at once, not just the first
            failures.append(f"line {example.line}: {type(exc).__name__}: {exc}")
    assert failures == []


def test_every_skip_gives_a_reason() -> None:
    bare = [
        f"{page.relative_to(REPO)}: {match.group(0)}"
        for page in PAGES
        for match in SKIP.finditer(page.read_text())
        if not match.group(2).strip().startswith('"')
    ]
    assert bare == []


def test_ci_runs_the_readmes_commands_verbatim() -> None:
    """The README's two commands are marked "run verbatim by .ci/run": they are."""
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.DOTALL)
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert len(commands) == 2
    assert [command in ci for command in commands] == [True, True]
