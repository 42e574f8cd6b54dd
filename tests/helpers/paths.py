"""Where things are, for tests in any folder below ``tests/``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"  # worker scripts run under `rankwise launch` (not test modules)
EXAMPLES = REPO / "examples"
DOCS = REPO / "docs"
