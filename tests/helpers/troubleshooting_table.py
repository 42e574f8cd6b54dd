"""docs/troubleshooting.md's table as data, and the helpers its trigger tests share
(tests/test_troubleshooting*.py; tests/troubleshooting/test_troubleshooting_coverage.py reads the table too)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

from helpers.paths import DOCS

TABLE = DOCS / "troubleshooting.md"


def rows() -> dict[str, tuple[str, str]]:
    """``id -> (error type, message)`` from the table's rows."""
    found: dict[str, tuple[str, str]] = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) < 5 or not cells[0].startswith("`"):
            continue  # not a table row, or the header or separator
        # | id | where | you did | error | message | fix | also tested in |
        row_id, error, message = cells[0].strip("`"), cells[3].strip("`"), cells[4]
        assert message.startswith("`` ") and message.endswith(" ``"), line
        assert row_id not in found, f"duplicate row id {row_id}"
        found[row_id] = (error, message[3:-3])
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
