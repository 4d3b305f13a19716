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


def test_the_rendered_reference_shows_no_sphinx_role() -> None:
    """The mkdocs hook turns ``:class:<code>~a.B</code>`` (how mkdocstrings renders a
    Sphinx role of a Google-style docstring) into ``<code>B</code>``."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "docs_hooks" / "sphinx_roles.py"
    spec = importlib.util.spec_from_file_location("sphinx_roles", path)
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    html = (
        "see :meth:<code>stop</code>, :class:<code>~ackgate.Message</code> and "
        ":mod:<code>ackgate._service.calls</code>; <code>:class:</code> in code stays"
    )
    assert hook.on_page_content(html, page=None) == (
        "see <code>stop</code>, <code>Message</code> and "
        "<code>ackgate._service.calls</code>; <code>:class:</code> in code stays"
    )
    assert "docs_hooks/sphinx_roles.py" in (path.parents[1] / "mkdocs.yml").read_text()
