"""The static checks as tests: ruff's lint and format check and mypy, over the same paths as
the project's configuration names. Run by pytest (so CI runs them beside the multi-process
tests, which spend much of their time waiting), each a subprocess in the repository root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.paths import REPO

PATHS = ["src", "tests", "benchmarks", "scripts", "examples"]
CHECKS = {
    "ruff check": ["ruff", "check", *PATHS],
    "ruff format": ["ruff", "format", "--check", *PATHS],
    "mypy": ["mypy"],  # [tool.mypy] files in pyproject.toml
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_static_check_passes(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *CHECKS[name]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-6000:]}{result.stderr[-3000:]}"
