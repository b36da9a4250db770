"""A stored string (``devices.json``, a manifest) put in a markdown table cell of report.md or README.md as plain
text: :func:`cell`. The Hub renders a card's HTML and markdown, so a string from a file someone can edit must not
bring tags, links, images or a line break into the page, nor a ``|`` that starts a new column."""

from __future__ import annotations

import re
import unicodedata

# a backslash first: it must not turn the escape of the character after it into a literal
_ESCAPES = {"\\": "\\\\", "|": "\\|", "[": "\\[", "]": "\\]", "`": "\\`", "&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPE_RE = re.compile("|".join(re.escape(c) for c in _ESCAPES))
# line breaks (\n, \r, U+2028/2029, NEL), other controls and format characters (bidi overrides, zero widths)
_BREAKING = {"Cc", "Cf", "Zl", "Zp"}


def _one_line(text: str) -> str:
    return "".join(" " if unicodedata.category(c) in _BREAKING else c for c in text)


def cell(value, code: bool = False) -> str:
    """``value`` as text for one table cell: on one line (line breaks and control characters as spaces), ``|``
    escaped; as plain text, ``& < >`` as entities and ``\\ [ ] ` `` escaped (no HTML, link, image or code span;
    ``*`` and ``_`` are kept, as in names like Q8_0 and x86_64); with ``code``, as inline code, where markdown and
    HTML are not interpreted, fenced with more backticks than it holds."""
    text = _one_line(str(value))
    if not code:
        return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], text)
    text = text.replace("|", "\\|")  # GFM splits the row before it reads code spans; \| stays a | inside one
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
