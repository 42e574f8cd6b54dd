"""The catalogue of a checkpoint location, written once for every backend of
:class:`~rankwise.storage.Storage` (a local folder, a bucket): which names are checkpoints,
the ``latest`` pointer, the order a resume tries them in, the first one that is valid, and
pruning after a save.

Names are ``{prefix}-e{epoch}-s{step}.pt`` (a file and its manifest) or ``.dcp`` (a sharded
folder holding its manifest), zero-padded so they sort by age; ``{prefix}-latest.json`` names
the newest committed one. :meth:`Catalogue.commit` moves the pointer, then prunes: a kill at
any point leaves the pointer naming a checkpoint that was complete when it was written.

>>> from rankwise.storage import Storage
>>> catalogue = Catalogue(Storage.for_url("memory://rankwise-doc/catalogue"), keep_last=2)
>>> for step in (1, 2, 3):
...     name = catalogue.name_for(0, step)
...     _ = catalogue.storage.put(b"data", name)
...     _ = catalogue.storage.put(b"{}", manifest_key(name))
...     catalogue.commit(name, {"epoch": 0, "step": step})
>>> catalogue.names()
['ckpt-e000000-s000000002.pt', 'ckpt-e000000-s000000003.pt']
>>> catalogue.candidates()[0]
'ckpt-e000000-s000000003.pt'
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from rankwise.storage import Storage
from rankwise.storage.local import json_bytes
from rankwise.train.checkpoint.errors import CheckpointError, CheckpointWarning
from rankwise.train.checkpoint.faults import fault_point
from rankwise.train.checkpoint.manifests import manifest_path
from rankwise.train.checkpoint.sharded import MANIFEST, SUFFIX

__all__ = [
    "Catalogue",
    "check_naming",
    "check_position",
    "manifest_key",
    "name_pattern",
]

T = TypeVar("T")
_PREFIX = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_naming(keep_last: int | None, prefix: str) -> None:
    """Refuse a ``keep_last`` or ``prefix`` a checkpoint catalogue cannot use."""
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ValueError(
            f"keep_last ({keep_last!r}) must be an integer >= 1, or None to keep every checkpoint."
        )
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ValueError(
            f"prefix ({prefix!r}) must be a plain file-name part (letters, digits, '_', "
            "'.', '-'; not starting with '.' or '-'), e.g. 'ckpt' or 'rank1'."
        )


def check_position(epoch: int, step: int) -> None:
    for name, value in (("epoch", epoch), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} ({value!r}) must be an integer >= 0.")


def name_pattern(prefix: str) -> re.Pattern[str]:
    """``{prefix}-e{epoch}-s{step}`` with a file's or a folder's suffix."""
    return re.compile(rf"^{re.escape(prefix)}-e(\d+)-s(\d+)(\.pt|\{SUFFIX})$")


def manifest_key(name: str) -> str:
    """The key of checkpoint file ``name``'s manifest, beside it (a folder holds its own).

    >>> manifest_key("ckpt-e000000-s000000001.pt")
    'ckpt-e000000-s000000001.pt.sha256.json'
    """
    return manifest_path(name).name


class Catalogue:
    """The checkpoints of ``prefix`` under ``storage`` (see the module). ``keep_last``: how
    many complete ones a prune keeps (``None``: all), checked here, once for every backend."""

    def __init__(self, storage: Storage, prefix: str = "ckpt", keep_last: int | None = None):
        check_naming(keep_last, prefix)
        self.storage = storage
        self.prefix = prefix
        self.keep_last = keep_last
        self._name = name_pattern(prefix)
        self._warned_newer = False

    @property
    def pointer_key(self) -> str:
        """The key of the JSON object naming the newest committed checkpoint."""
        return f"{self.prefix}-latest.json"

    def name_for(self, epoch: int, step: int, *, sharded: bool = False) -> str:
        """The name a save at ``(epoch, step)`` writes (zero-padded: names sort by age)."""
        suffix = SUFFIX if sharded else ".pt"
        return f"{self.prefix}-e{epoch:06d}-s{step:09d}{suffix}"

    def position(self, name: str) -> tuple[int, int]:
        """``(epoch, step)`` of checkpoint ``name``."""
        match = self._name.match(name)
        if match is None:
            raise ValueError(f"{name!r} is not a checkpoint name of prefix {self.prefix!r}.")
        return int(match[1]), int(match[2])

    def names(self) -> list[str]:
        """Every checkpoint of this prefix (files and sharded folders), valid or not, oldest
        first (by epoch, step)."""
        found = self.storage.names() + self.storage.names(folders=True)
        return sorted((n for n in found if self._name.match(n)), key=self._order)

    def _order(self, name: str) -> tuple[int, int, str]:
        return (*self.position(name), name)

    def pointer_target(self, names: list[str]) -> str | None:
        """The name the pointer holds when it is one of ``names``; ``None`` when there is no
        pointer, and (with a :class:`CheckpointWarning` saying so) when it is unreadable or
        names a checkpoint that is not there."""
        where = self.storage.url_of(self.pointer_key)
        try:
            name = json.loads(self.storage.read(self.pointer_key))["file"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            warnings.warn(
                f"checkpoint pointer {where} is unreadable ({e}); scanning the folder for the "
                "newest valid checkpoint instead.",
                CheckpointWarning,
                stacklevel=5,
            )
            return None
        if str(name) not in names:
            warnings.warn(
                f"checkpoint pointer {where} names {name!r}, which is not in "
                f"{self.storage.display_url}; scanning for the newest valid checkpoint instead.",
                CheckpointWarning,
                stacklevel=5,
            )
            return None
        return str(name)

    def candidates(self, names: list[str] | None = None) -> list[str]:
        """The checkpoints in the order a resume tries them: the pointer's target, then those
        older than it newest first, then newer ones (a save killed before its pointer moved).
        ``names``: the checkpoints to order (default: :meth:`names`)."""
        names = self.names() if names is None else names
        target = self.pointer_target(names)
        if target is None:
            return names[::-1]
        older = [n for n in names if self._order(n) < self._order(target)]
        newer = [n for n in names if self._order(n) > self._order(target)]
        return [target, *older[::-1], *newer[::-1]]

    def first_valid(self, take: Callable[[str], T]) -> tuple[str, T] | None:
        """``(name, take(name))`` for the first of :meth:`candidates` whose ``take`` does not
        raise :class:`CheckpointError`; each skipped one is named by a
        :class:`CheckpointWarning`."""
        for name in self.candidates():
            try:
                return name, take(name)
            except CheckpointError as e:
                warnings.warn(
                    f"{e} Skipping it and trying the previous checkpoint.",
                    CheckpointWarning,
                    stacklevel=3,
                )
        return None

    def commit(self, name: str, pointer: dict[str, Any]) -> None:
        """Move the pointer to ``name`` (its JSON holds ``pointer``'s fields too: epoch,
        step), then :meth:`prune`. Call it once ``name`` and its manifest are in place."""
        fault_point("before-pointer")
        self.storage.put(json_bytes({**pointer, "file": name}), self.pointer_key)
        fault_point("before-prune")
        self.prune(name)

    def prune(self, saved: str) -> list[str]:
        """Delete, among the checkpoints older than ``saved`` (files and folders alike), the
        incomplete ones (no manifest: a save killed before it finished, never valid) and all
        but the ``keep_last - 1`` newest complete ones; return their names. Newer ones are
        left alone (a save may be in flight), with one warning per catalogue. Each goes
        manifest first, so a kill in between leaves data no reader trusts, never a manifest
        vouching for missing data."""
        names = self.names()
        newer = [n for n in names if self._order(n) > self._order(saved)]
        if newer and not self._warned_newer:
            self._warned_newer = True
            warnings.warn(
                f"{self.storage.display_url} holds checkpoints newer than the one just saved "
                f"({saved}): {newer}. They are kept, but the pointer names the new one; remove "
                "them, or use another folder per run.",
                CheckpointWarning,
                stacklevel=4,
            )
        older = [n for n in names if self._order(n) < self._order(saved)]
        doomed = [n for n in older if not self._complete(n)]
        if self.keep_last is not None:
            complete = [n for n in older if n not in doomed]
            doomed += complete[: max(0, len(complete) - (self.keep_last - 1))]
        for name in doomed:
            if name.endswith(SUFFIX):
                self.storage.delete_folder(name, first=[MANIFEST])
            else:
                self.storage.delete(manifest_key(name), name)
        return sorted(doomed, key=self._order)

    def _complete(self, name: str) -> bool:
        if name.endswith(SUFFIX):
            return self.storage.child(name).exists(MANIFEST)
        return self.storage.exists(manifest_key(name))
