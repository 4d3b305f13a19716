"""mkdocs hook: the Sphinx roles of ackgate's docstrings rendered as code, not as text.

The docstrings are Google style with Sphinx cross-reference roles (``:class:`X```,
``:meth:``, ``:mod:``...), which read well in ``help()`` and editors; mkdocstrings
renders the role's name as text before the code (``:class:<code>X</code>``). This
hook drops the role and, for ``~a.b.C``, keeps ``C``, as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def strip_roles(html: str) -> str:
    """``html`` with every rendered role replaced by its code alone."""

    def code(match: re.Match[str]) -> str:
        short, target = match.groups()
        shown = target.rsplit(".", 1)[-1] if short else target
        return f"<code>{shown}</code>"

    return ROLE.sub(code, html)


def on_page_content(html: str, **kwargs: Any) -> str:
    return strip_roles(html)
