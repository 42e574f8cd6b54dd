"""Atomic writes to a local folder: a temporary name beside the target, flushed and fsynced,
renamed over the target with ``os.replace``, then the folder fsynced. A kill at any point
leaves the old content or the new, never a torn file under the final name.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
>>> write_atomic(path, lambda f: f.write(b"abc")), path.read_bytes()
(3, b'abc')
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "TMP_MARK",
    "LocalFiles",
    "fsync_dir",
    "json_bytes",
    "remove_tree",
    "tmp_name",
    "write_atomic",
]

TMP_MARK = ".tmp-"


def fsync_dir(directory: Path) -> None:
    """Make the renames in ``directory`` durable (where the platform allows it)."""
    # Makes the rename itself durable; not possible on every platform (Windows).
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def tmp_name(path: Path) -> Path:
    """A hidden name beside ``path`` for its write in progress, marked with this process's id
    (so that a later save removes it only once this process is gone)."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_atomic(
    path: Path, write: Callable[[Any], Any], before_rename: Callable[[], None] | None = None
) -> Any:
    """``write(f)`` into a temporary file beside ``path``, fsync it, rename it to ``path``
    (``before_rename()`` first, if given) and fsync the folder; return what ``write``
    returned. A failure leaves no temporary file and ``path`` as it was."""
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return result


def remove_tree(folder: Path) -> None:
    """Delete ``folder`` and its content: renamed away first (atomic), so a kill mid-delete
    never leaves a half-deleted folder under its name."""
    doomed = tmp_name(folder)
    try:
        os.replace(folder, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def json_bytes(obj: dict[str, Any]) -> bytes:
    """``obj`` as the JSON every manifest and pointer is written as (indented, keys sorted)."""
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


class LocalFiles:
    """The filesystem calls :class:`~rankwise.storage.Storage` makes, on a local folder, each
    write atomic (:func:`write_atomic`): the local backend of the one store interface. Paths
    are the store's full paths (the folder joined with a key), as fsspec's are."""

    def pipe_file(self, path: str, data: bytes, **_: Any) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(path), lambda f: f.write(data))

    def put_file(self, local: str, path: str, **_: Any) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(local, "rb") as source:
            write_atomic(Path(path), lambda f: shutil.copyfileobj(source, f, 8 << 20))

    def cat_file(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def open(self, path: str, mode: str = "rb") -> Any:
        return open(path, mode)

    def cat_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], **_: Any
    ) -> list[bytes]:
        """The bytes ``[start, end)`` of each path, as fsspec's ``cat_ranges`` (one open per
        file; ``os.pread``, so no shared file position)."""
        out: list[bytes] = []
        handles: dict[str, int] = {}
        try:
            for path, start, end in zip(paths, starts, ends, strict=True):
                if path not in handles:
                    handles[path] = os.open(path, os.O_RDONLY)
                out.append(os.pread(handles[path], end - start, start))
        finally:
            for fd in handles.values():
                os.close(fd)
        return out

    def get_file(self, path: str, dest: str) -> None:
        shutil.copyfile(path, dest)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def ls(self, path: str, detail: bool = True, **_: Any) -> list[dict[str, Any]]:
        with os.scandir(path) as entries:  # a missing folder: FileNotFoundError, as fsspec's
            return [
                {"name": e.path, "type": "directory" if e.is_dir() else "file"} for e in entries
            ]

    def rm_file(self, path: str) -> None:
        """Delete the file ``path``, or the folder ``path`` once it is empty (a folder's own
        entry, as on a store that keeps one)."""
        if os.path.isdir(path):
            with contextlib.suppress(OSError):  # not empty: its files go by their own keys
                os.rmdir(path)
            return
        os.unlink(path)
        fsync_dir(Path(path).parent)
