"""Fault injection for tests: :func:`set_fault_hook` installs a function called with the name
of each point of a save (:data:`FAULT_POINTS`), on disk and in object storage;
:func:`rankwise.testing.kill_at_checkpoint` installs one that SIGKILLs the process there.

Module state: the installed hook. A fault is injected into a process (a test's worker, the
fault sweep's ranks) wherever its saves run, the background writer's thread included, so the
hook is one per process, set before training and read at each point, not a field of a manager
the script may never see."""

from __future__ import annotations

from collections.abc import Callable

# Points of a save where a fault hook is called, in order. "mid-write": part of the data is in
# the temporary file; "before-rename": the temporary file is complete and fsynced;
# "before-manifest": the data has its final name, the manifest is not written yet;
# "before-pointer" / "before-prune": CheckpointManager.save's later steps.
# In object storage (backends.BucketSaves): "mid-upload", after the first part (or the whole
# object, when it is one part) of the data is uploaded (a sharded save: of each file a rank
# uploads); then "before-manifest", "before-pointer" and "before-prune" as on disk.
FAULT_POINTS = (
    "mid-write",
    "before-rename",
    "before-manifest",
    "before-pointer",
    "before-prune",
    "mid-upload",
)


_fault_hook: Callable[[str], None] | None = None


def set_fault_hook(hook: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Install ``hook(point)``, called at each of :data:`FAULT_POINTS` during a save (``None``
    removes it); returns the previous hook. For fault-injection tests only."""
    global _fault_hook
    previous, _fault_hook = _fault_hook, hook
    return previous


def fault_point(name: str) -> None:
    """Call the fault hook (if any) at point ``name`` of a save."""
    if _fault_hook is not None:
        _fault_hook(name)


def armed() -> bool:
    """Whether a fault hook is installed (a writer then flushes before its fault point, so a
    kill there leaves a torn file on disk, not in a buffer)."""
    return _fault_hook is not None
