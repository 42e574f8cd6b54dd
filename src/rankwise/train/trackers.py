"""The experiment trackers' old import path, kept for code that imports it (e.g.
``rankwise.train.trackers.WANDB_FLUSH_SECONDS``): they live in :mod:`rankwise.train.tracking`
now. Names only."""

from rankwise.train.tracking import (
    EXTRAS,
    PROBE_SECONDS,
    STEP_KEY,
    WANDB_FLUSH_SECONDS,
    MlflowTracker,
    Tracker,
    TrackerOptionError,
    TrackerSet,
    TrackerUnreachableError,
    TrackerWarning,
    WandbTracker,
    build_trackers,
    probe,
    require,
    run_artifacts,
    share_run_ids,
    shown_url,
)

__all__ = [
    "EXTRAS",
    "PROBE_SECONDS",
    "STEP_KEY",
    "WANDB_FLUSH_SECONDS",
    "MlflowTracker",
    "Tracker",
    "TrackerOptionError",
    "TrackerSet",
    "TrackerUnreachableError",
    "TrackerWarning",
    "WandbTracker",
    "build_trackers",
    "probe",
    "require",
    "run_artifacts",
    "share_run_ids",
    "shown_url",
]
