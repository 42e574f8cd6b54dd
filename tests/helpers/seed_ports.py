"""Compare a seed guide's port with the guide's code, statement by statement.

A port keeps the guide's code verbatim but for its imports; what it adds is marked: a statement
with a ``# port`` comment on one of its lines (for a compound statement, on its header), and
blocks from ``# --- port: ...`` to ``# --- end of port ...`` (or the end of the file). Both
sides are parsed and unparsed with :mod:`ast`, so formatting and comments never matter, only
the code: a port whose unmarked code drifts from the guide no longer compares equal.

>>> units("x = 1  # port\\nfor i in y:\\n    f(i)\\n    g(i)  # port\\n")
['for i in y:', 'f(i)', 'end']
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from helpers.paths import REPO

# The guides live in ../shared/seeds beside the checkout (a worktree may sit one level deeper).
SEEDS = next(
    (
        folder / "shared" / "seeds"
        for folder in Path(__file__).resolve().parents
        if (folder / "shared" / "seeds").is_dir()
    ),
    REPO.parent / "shared" / "seeds",
)
# A number as the ports print it (``{x:.3g}``, ``repr(float)``, ``{x:.4f}``). The ranks of a run
# share one stdout and, unbuffered (PYTHONUNBUFFERED=1), print writes a line and its newline
# separately, so another rank's line can follow without a line break: patterns match numbers,
# never ``\S+`` (which would swallow the next rank's "rank N") nor ``^``/``$`` anchors.
NUM = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
_MARK = re.compile(r"#\s*port\b")
_BLOCK_START = re.compile(r"^\s*#\s*---\s*port\b")
_BLOCK_END = re.compile(r"^\s*#\s*---\s*end of port\b")


def _marked_lines(source: str) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0] for t in tokens if t.type == tokenize.COMMENT and _MARK.match(t.string)}


def _without_port_blocks(source: str) -> str:
    # Blank the lines of port blocks (keeping line numbers for the marks).
    lines, inside = source.splitlines(), False
    for i, line in enumerate(lines):
        if _BLOCK_START.match(line):
            inside = True
        if inside:
            lines[i] = ""
        if _BLOCK_END.match(line):
            inside = False
    return "\n".join(lines) + "\n"


def units(source: str, *, drop_port: bool = True) -> list[str]:
    """The statements of ``source``, unparsed one per unit (a compound statement as its header,
    its body's units, then ``"end"``), without the docstring and, with ``drop_port``, without
    what the port marks as its own."""
    if drop_port:
        source = _without_port_blocks(source)
    marked = _marked_lines(source) if drop_port else set()
    tree = ast.parse(source)
    body = tree.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        body = body[1:] if isinstance(first.value.value, str) else body  # the docstring
    out: list[str] = []
    _walk(body, marked, out)
    # Imports compare as a set (a formatter sorts them, and the names inside them).
    imports = sorted(u for u in out if u.startswith(("import ", "from ")))
    return imports + [u for u in out if not u.startswith(("import ", "from "))]


def _walk(body: list[ast.stmt], marked: set[int], out: list[str]) -> None:
    for stmt in body:
        blocks = [
            getattr(stmt, name)
            for name in ("body", "orelse", "finalbody")
            if getattr(stmt, name, None)
        ]
        if not blocks:
            end = stmt.end_lineno or stmt.lineno
            if not marked & set(range(stmt.lineno, end + 1)):
                if isinstance(stmt, ast.ImportFrom):
                    stmt.names = sorted(stmt.names, key=lambda a: a.name)
                out.append(ast.unparse(stmt))
            continue
        # A def's header runs from its first decorator to its body.
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
        header_end = max(first, blocks[0][0].lineno - 1)
        if marked & set(range(first, header_end + 1)):
            continue
        out.append(ast.unparse(stmt).splitlines()[0])
        for block in blocks:
            _walk(block, marked, out)
        out.append("end")


def guide_code(guide: str, heading: str) -> str:
    """The first Python code block after ``heading`` (a markdown ``### ...`` line, or an rst
    title line) in ``SEEDS / guide``."""
    text = (SEEDS / guide).read_text()
    start = text.index("\n" + heading + "\n")
    rest = text[start:]
    fenced = re.search(r"```python\n(.*?)```", rest, re.S)
    directive = re.search(r"\.\. code-block:: python\n\n((?:[ \t]+.*\n|\n)+)", rest)
    found = [m for m in (fenced, directive) if m]
    first = min(found, key=lambda m: m.start())
    code = first.group(1)
    if first is directive:
        lines = code.splitlines()
        indent = min(len(s) - len(s.lstrip()) for s in lines if s.strip())
        code = "\n".join(s[indent:] for s in lines) + "\n"
    return code


def expected_units(
    code: str, imports: dict[str, str], replaced: list[str], needed_import: str
) -> list[str]:
    """The guide's ``code`` as its port must read: ``imports`` swapped (guide line -> port
    line), ``needed_import`` added if the guide's snippet lacks it (a port must import what it
    runs), and the ``replaced`` statements removed, each once: those the port replaces with a
    marked line of its own, each a documented difference."""
    for old, new in imports.items():
        code = re.sub(rf"^{re.escape(old)}$", new, code, flags=re.M)
    (needed,) = units(needed_import, drop_port=False)
    if needed not in units(code, drop_port=False):
        code = needed_import + "\n" + code
    got = units(code, drop_port=False)
    for statement in replaced:
        got.remove(ast.unparse(ast.parse(statement)))  # ValueError: the guide lacks it
    return got
