"""MkDocs hook: show the docstrings' Sphinx roles (:class:`Name`, :func:`name`, ...) as plain code.

avsr's docstrings name other objects with Sphinx roles. Rendered as Markdown, a role followed by a code span
comes out as ``:class:<code>AVHubertEncoder</code>``; this hook drops the role prefix (and a leading ``~``
inside the code span), so the page shows ``AVHubertEncoder`` as code. The sources stay as they are.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|term):(<code>)~?")


def on_page_content(html: str, **kwargs) -> str:
    """Drop the role prefixes from a page's HTML."""
    return ROLE.sub(r"\1", html)
