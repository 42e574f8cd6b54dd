"""The Ray report's old import path, kept because users name it in Ray's settings
(``worker_process_setup_hook="rankwise.train.ray_report.quiet_ray_workers"``, as
examples/ray_train.py does): it lives in :mod:`rankwise.train.tracking.ray_report` now.
Names only."""

from rankwise.train.tracking.ray_report import (
    CLEANER_LOGGER,
    POINTER_FILE,
    RayReport,
    check_checkpoint_dir,
    quiet_ray_workers,
    rankwise_checkpoint,
)

__all__ = [
    "CLEANER_LOGGER",
    "POINTER_FILE",
    "RayReport",
    "check_checkpoint_dir",
    "quiet_ray_workers",
    "rankwise_checkpoint",
]
