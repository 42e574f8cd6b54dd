"""A griffe extension that lets rankwise's reST-flavoured docstrings render as Markdown.

mkdocstrings (``mkdocs.yml``: ``extensions: [scripts/mkdocs_docstrings.py:RestToMarkdown]``)
reads docstrings as Markdown, but rankwise writes them for ``help()`` and doctest:

- a doctest (``>>>`` through the next blank line) would run together into one paragraph, and
  its output (``[[0, 1], [2, 3]]``) would read as a Markdown reference link, which strict
  mode reports as a broken link; it becomes a fenced ``pycon`` block;
- ``:func:`~rankwise.data.contiguous_range``` becomes the code span ``contiguous_range``;
- a paragraph ending in ``::`` (a reST literal block) ends in ``:``; the indented block after
  it is already a Markdown code block.

Only the rendered page changes: the docstrings in the source (and ``help()``, and doctest)
stay as written.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    # ``~a.b.c`` shows ``c``, as Sphinx would.
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def rest_to_markdown(text: str) -> str:
    """``text`` with doctests fenced, reST roles as code spans and ``::`` as ``:``."""
    out: list[str] = []
    in_doctest = False
    for line in text.splitlines():
        stripped = line.strip()
        if not in_doctest and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            in_doctest = True
        elif in_doctest and not stripped:
            out.append(f"{indent}```")
            in_doctest = False
        if not in_doctest:
            line = _ROLE.sub(_role, line)
            if line.endswith("::") and line.strip() != "::":
                line = line[:-1]
        out.append(line)
    if in_doctest:
        out.append(f"{indent}```")
    return "\n".join(out)


class RestToMarkdown(griffe.Extension):
    """Rewrite each docstring as it is loaded (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)
