"""docs/troubleshooting.md's table as data, and the helpers its trigger tests share
(tests/test_troubleshooting*.py; tests/troubleshooting/test_troubleshooting_coverage.py reads the table too)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

from helpers.paths import DOCS

TABLE = DOCS / "troubleshooting.md"


# The header of every table of rows; the page's other tables (``| you see | cause | fix |``:
# lines rankwise prints that are not exceptions) have none and are not rows.
HEADER = ["id", "you see", "cause", "fix"]
# ``| `id` | `ErrorType`: `` message `` | cause | fix |``
_SEEN = re.compile(r"`(\w+)`: `` (.*) ``", re.DOTALL)


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def rows() -> dict[str, tuple[str, str]]:
    """``id -> (error type, message)`` from the page's tables of rows.

    A table of rows starts at a ``| id | you see | cause | fix |`` header; every line of it
    after the separator must be a row in the documented form (a malformed one fails here, it
    is not skipped), and the page must hold rows at all."""
    found: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in TABLE.read_text().splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells == HEADER:
            in_table = True
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue  # another table's line, or the separator
        assert len(cells) == len(HEADER), f"a row needs {len(HEADER)} cells: {line}"
        row_id, seen = cells[0], _SEEN.fullmatch(cells[1])
        assert re.fullmatch(r"`[a-z0-9-]+`", row_id), f"a row's id is `lower-case-words`: {line}"
        assert seen is not None, f"a row's 'you see' is `ErrorType`: `` message ``: {line}"
        row_id = row_id.strip("`")
        assert row_id not in found, f"duplicate row id {row_id}"
        found[row_id] = (seen.group(1), seen.group(2))
    assert len(found) >= 300, f"only {len(found)} rows read from {TABLE}: is the format changed?"
    return found


def pattern(documented: str) -> re.Pattern[str]:
    """A documented message as a regex: each ``<NAME>`` matches the text that varies."""
    parts = re.split(r"<[A-Z_]+>", documented)
    return re.compile(".+?".join(re.escape(p) for p in parts), re.DOTALL)


def raised(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException:
    """The exception ``fn(*args, **kwargs)`` raises (it must raise)."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the row says which type
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} raised nothing")


def warned(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException:
    """The one warning ``fn(*args, **kwargs)`` gives (a Warning is an Exception: its type name
    and ``str`` are what a row documents)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args, **kwargs)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = caught[0].message
    assert isinstance(message, Warning)
    return message


def check_row(row_id: str, trigger: Callable[[], BaseException]) -> None:
    """The trigger's error has the row's type and exactly its message."""
    error, message = rows()[row_id]
    exc = trigger()
    assert type(exc).__name__ == error, (row_id, type(exc).__name__, str(exc))
    assert pattern(message).fullmatch(str(exc)), f"{row_id}:\n  doc: {message}\n  got: {exc}"


def run_cases(cases: dict[str, Callable[[], object]]) -> dict[str, tuple[str, str]]:
    """Each case's ``(error type, message)``, or ``("NoError", "no error")``: what a rank
    sends back from a shared multi-process run, for the triggers to look up."""
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[name] = ("NoError", "no error")
        except Exception as exc:
            out[name] = (type(exc).__name__, str(exc))
    return out
