"""Where a run's numbers go, on rank 0: one :class:`~rankwise.train.tracking.sink.Sink`
interface for rankwise's CSV, TensorBoard, W&B and MLflow, the logger that feeds them, the
history, and the report to Ray Train.

- :mod:`~rankwise.train.tracking.sink`: the interface (:class:`Sink`), its rows
  (:class:`StepRow`, :class:`EpochRow`) and the trackers' base (:class:`Tracker`);
- :mod:`~rankwise.train.tracking.csv_log`, :mod:`~rankwise.train.tracking.tensorboard_log`,
  :mod:`~rankwise.train.tracking.wandb_tracker`, :mod:`~rankwise.train.tracking.mlflow_tracker`:
  the four sinks;
- :mod:`~rankwise.train.tracking.tracker_set`: the trackers driven together, each call
  guarded (a tracker never stops training), one tracker run per job;
  :mod:`~rankwise.train.tracking.probe`: their servers asked once before a run starts;
- :mod:`~rankwise.train.tracking.logger`: :class:`TrainingLogger`, the progress bar, the
  console lines and the fan-out to the sinks;
- :mod:`~rankwise.train.tracking.history`: :class:`DistributedTrainingHistory`;
- :mod:`~rankwise.train.tracking.ray_report`: :class:`RayReport` and ``quiet_ray_workers``.

>>> from rankwise.train.tracking import CSV_COLUMNS
>>> CSV_COLUMNS[:5]
('wall_time', 'kind', 'epoch', 'step', 'global_step')
"""

from rankwise.train.tracking.csv_log import CSV_COLUMNS, EPOCH_COLUMNS, STEP_COLUMNS, CsvLog
from rankwise.train.tracking.history import DistributedTrainingHistory
from rankwise.train.tracking.logger import TrainingLogger
from rankwise.train.tracking.mlflow_tracker import MlflowTracker
from rankwise.train.tracking.probe import PROBE_SECONDS, TrackerUnreachableError, probe, shown_url
from rankwise.train.tracking.ray_report import (
    RayReport,
    check_checkpoint_dir,
    quiet_ray_workers,
    rankwise_checkpoint,
)
from rankwise.train.tracking.sink import EpochRow, Sink, StepRow, Tracker, tracker_metrics
from rankwise.train.tracking.tensorboard_log import TensorBoardLog
from rankwise.train.tracking.tracker_set import (
    EXTRAS,
    TrackerSet,
    TrackerWarning,
    build_trackers,
    require,
    run_artifacts,
    share_run_ids,
)
from rankwise.train.tracking.wandb_tracker import (
    STEP_KEY,
    WANDB_FLUSH_SECONDS,
    TrackerOptionError,
    WandbTracker,
)

__all__ = [
    "CSV_COLUMNS",
    "EPOCH_COLUMNS",
    "EXTRAS",
    "PROBE_SECONDS",
    "STEP_COLUMNS",
    "STEP_KEY",
    "WANDB_FLUSH_SECONDS",
    "CsvLog",
    "DistributedTrainingHistory",
    "EpochRow",
    "MlflowTracker",
    "RayReport",
    "Sink",
    "StepRow",
    "TensorBoardLog",
    "Tracker",
    "TrackerOptionError",
    "TrackerSet",
    "TrackerUnreachableError",
    "TrackerWarning",
    "TrainingLogger",
    "WandbTracker",
    "build_trackers",
    "check_checkpoint_dir",
    "probe",
    "quiet_ray_workers",
    "rankwise_checkpoint",
    "require",
    "run_artifacts",
    "share_run_ids",
    "shown_url",
    "tracker_metrics",
]
