"""Shared fixtures: every test runs with its environment restored and no process group left."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rankwise.testing import hygiene


@pytest.fixture(autouse=True)
def _hygiene() -> Iterator[None]:
    with hygiene():
        yield


# Helper scripts run under `rankwise launch`; they are not test modules (and parse argv on import).
collect_ignore = ["scripts"]
