"""Where ``fit`` keeps its checkpoints: :func:`manager_for` turns the config's
``checkpoint_dir`` into the manager of this process's folder or URL (one per rank unless rank 0
alone saves; a slot's own under ``--on-failure continue``).
"""

from __future__ import annotations

from pathlib import Path

import rankwise.distributed as rd
from rankwise.storage import Storage, is_remote_url
from rankwise.train.checkpoint.manager import CheckpointManager, RemoteCheckpointManager
from rankwise.train.checkpoint.resume import Manager
from rankwise.train.config import DistributedTrainingConfig

__all__ = ["manager_for"]


def manager_for(cfg: DistributedTrainingConfig, roles: rd.Roles | None = None) -> Manager | None:
    """The checkpoint folder's manager (one folder per rank unless rank 0 alone saves);
    under ``strategy="fsdp"`` it writes sharded DCP folders, every rank its shards (to a
    local folder or a bucket). Per-rank
    folders are a process's own: by slot under ``--on-failure continue`` (a restarted slot 2
    writes ``rank-2/`` again, not ``rank-0/`` of its world of one). A relative folder is
    refused for a continue job on more than one node (rank 0 moves between nodes: the folder
    must be shared).

    An object-storage URL gives a :class:`RemoteCheckpointManager`, checked here on every rank
    (reachable, writable: a :class:`~rankwise.train.checkpoint.StorageError` naming the URL
    and the fix before the first step), and its writer's stale multipart uploads aborted.
    ``roles``: this process's (:class:`rankwise.distributed.Roles`; default: built here)."""
    if cfg.checkpoint_dir is None:
        return None
    roles = rd.Roles.for_this_process() if roles is None else roles
    per_rank = "" if cfg.save_on_master_only else f"rank-{roles.slot}"
    keep = cfg.keep_last_checkpoints
    sharded = cfg.strategy == "fsdp"
    if is_remote_url(cfg.checkpoint_dir):
        url = cfg.checkpoint_dir.rstrip("/") + (f"/{per_rank}" if per_rank else "")
        storage = Storage.for_url(url, cfg.checkpoint_storage_options)
        manager = RemoteCheckpointManager(
            storage, keep_last=keep, sharded=sharded, key=cfg.checkpoint_key
        )
        if per_rank or rd.is_master():  # the writer cleans its own URL
            manager.start()
        else:
            storage.check_writable()
        return manager
    base = Path(cfg.checkpoint_dir)
    if roles.continuing and roles.nnodes > 1 and not base.is_absolute():
        raise ValueError(
            f"checkpoint_dir ({cfg.checkpoint_dir!r}) is relative, and this --on-failure "
            f"continue job runs on {roles.nnodes} nodes: whoever is rank 0 writes each "
            "save, on whatever node it runs, so the saves would scatter over the nodes' own "
            "folders. Give an absolute path on storage every node shares (e.g. "
            "'/shared/run1/ckpt')."
        )
    folder = base / per_rank if per_rank else base
    return CheckpointManager(folder, keep_last=keep, sharded=sharded, key=cfg.checkpoint_key)
