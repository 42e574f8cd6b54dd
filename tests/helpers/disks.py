"""A real full disk for tests: a tmpfs mounted for the test (root, where ``mount`` works; the
test is skipped with the reason elsewhere), and a filler that leaves it nearly full."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``mount``'s ``size=``, e.g. ``"20m"``) mounted on ``folder``,
    unmounted after; skips the test with the reason where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, which needs root (CI runs as root)")
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def free_bytes(folder: Path) -> int:
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize


def fill(folder: Path, leave: int) -> None:
    """Fill ``folder``'s file system with ``folder/filler`` until about ``leave`` bytes are free."""
    with open(folder / "filler", "wb") as f:
        while (free := free_bytes(folder)) > leave:
            f.write(b"\0" * min(1 << 20, free - leave))
            f.flush()
