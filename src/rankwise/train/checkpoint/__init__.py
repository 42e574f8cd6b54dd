"""Crash-safe checkpoints for training (``rankwise.train.checkpoint``).

This ``__init__`` is the package's whole public face; code outside the package imports from
here, never from the modules below (their shared names are the package's internal API).

- Files (``files.py``): :func:`save_file` / :func:`load_file` write one checkpoint atomically
  (temporary file, fsync, ``os.replace``, folder fsync) with a manifest holding its size and
  XXH3-128 checksum (``manifests.py``: the format, its checks and the checkpoint key; manifests
  of version 1, written before, hold a SHA-256 and are still verified); loading verifies it
  and raises :class:`CheckpointError` (``errors.py``) naming the file and the fault.
  :func:`set_fault_hook` and :data:`FAULT_POINTS` (``faults.py``) let tests stop a save at
  each point.
- Folders and buckets (``manager.py``): :class:`CheckpointManager` keeps numbered
  checkpoints, a ``latest`` pointer that moves only once the new one is safe, pruning only
  after that, and :meth:`~CheckpointManager.latest` falls back to the previous good checkpoint
  when the newest is torn or corrupt. The rules are written once (``catalogue.py``: names,
  pointer, candidates, prune) over :class:`Storage`; the step that makes a finished checkpoint
  visible is the backend's (``backends.py``: a rename in a folder, an upload to a bucket).
  :class:`RemoteCheckpointManager` is the same manager over object storage, which ``fit``
  uses when ``checkpoint_dir`` is a URL. With ``sharded=True`` (FSDP2) a checkpoint is a DCP
  folder every rank writes its shards to, under the same rules (``sharded.py``);
  :func:`read_checkpoint` and :func:`find_latest` take a path or a URL.
- Wrapping-independent state (``portable.py``): :func:`model_state_dict`,
  :func:`optimizer_state_dict` and their loaders, :func:`rng_state` / :func:`set_rng_state`.
- During ``fit``: :class:`Checkpointer` (``checkpointer.py``) decides when to save (every N
  steps or epochs, the deferral at an epoch's end, the last save, the drain on SIGTERM) and
  saves through one background writer (``writer.py``) that stages the state in reused CPU
  buffers (:func:`snapshot`, ``staging.py``); :class:`SaveStats` is what that cost the loop.
  :func:`manager_for` (``placement.py``) is where ``fit`` saves, :func:`load_resume`
  (``resume.py``) what it resumes from.
- Object storage (``backends.py`` over ``rankwise.storage``): :class:`Storage` reaches a
  local folder or any fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``) with retries
  and errors that name the URL, never a credential; a bucket's checkpoint is uploaded as data,
  then manifest (there is no rename), before the pointer moves, and only what verifies is
  trusted; one sharded writer (``sharded.ShardedWriter``) serves folders and buckets, each
  rank uploading its own shards to a bucket.

>>> import tempfile
>>> manager = CheckpointManager(tempfile.mkdtemp(), keep_last=2)
>>> for step in (10, 20, 30):
...     _ = manager.save({"step": step}, epoch=0, step=step)
>>> [p.name for p in manager.checkpoints()]
['ckpt-e000000-s000000020.pt', 'ckpt-e000000-s000000030.pt']
>>> manager.load_latest()[1]
{'step': 30}
"""

from rankwise.storage import RetryPolicy, Storage, StorageError, StorageWarning
from rankwise.train.checkpoint.checkpointer import Checkpointer
from rankwise.train.checkpoint.errors import CheckpointError, CheckpointWarning
from rankwise.train.checkpoint.faults import FAULT_POINTS, set_fault_hook
from rankwise.train.checkpoint.files import load_file, save_file, verify_file
from rankwise.train.checkpoint.manager import (
    FORMAT_VERSION,
    CheckpointManager,
    RemoteCheckpointManager,
    find_latest,
    read_checkpoint,
)
from rankwise.train.checkpoint.manifests import manifest_path
from rankwise.train.checkpoint.placement import manager_for
from rankwise.train.checkpoint.portable import (
    load_model_state_dict,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
    rng_state,
    set_rng_state,
)
from rankwise.train.checkpoint.resume import load_resume
from rankwise.train.checkpoint.sharded import load_shards, sharded_state_dicts
from rankwise.train.checkpoint.staging import snapshot
from rankwise.train.checkpoint.writer import SaveStats

__all__ = [
    "FAULT_POINTS",
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWarning",
    "Checkpointer",
    "RemoteCheckpointManager",
    "RetryPolicy",
    "SaveStats",
    "Storage",
    "StorageError",
    "StorageWarning",
    "find_latest",
    "load_file",
    "load_model_state_dict",
    "load_optimizer_state_dict",
    "load_resume",
    "load_shards",
    "manager_for",
    "manifest_path",
    "model_state_dict",
    "optimizer_state_dict",
    "read_checkpoint",
    "rng_state",
    "save_file",
    "set_fault_hook",
    "set_rng_state",
    "sharded_state_dicts",
    "snapshot",
    "verify_file",
]
