"""A training run's settings: :class:`DistributedTrainingConfig` (the trainer's own fields,
checked on construction, YAML in and out) and :class:`ConfigTree` (a script's own nested
settings, read as attributes).

- :mod:`~rankwise.train.config.training`: the dataclass, the rules across its fields, YAML;
- :mod:`~rankwise.train.config.rules`: the rules of single fields (integers, booleans,
  paths, choices, numbers) with the tables of the fields each guards;
- :mod:`~rankwise.train.config.storage`, :mod:`~rankwise.train.config.loggers`,
  :mod:`~rankwise.train.config.compile`: the option dicts' rules (the checkpoint store's,
  the loggers' and trackers', torch.compile's), :mod:`~rankwise.train.config.plain` the two
  they share;
- :mod:`~rankwise.train.config.overrides`: ``"field=value"`` strings;
- :mod:`~rankwise.train.config.tree`: :class:`ConfigTree`.

>>> DistributedTrainingConfig().with_overrides("epochs=3").epochs
3
"""

from rankwise.train.config.compile import COMPILE_MODES, check_compile_options
from rankwise.train.config.loggers import (
    LOGGERS,
    MLFLOW_OPTIONS,
    TRACKERS,
    MlflowOptions,
    check_logger_options,
    check_loggers,
)
from rankwise.train.config.plain import check_yaml_values, refuse_redacted
from rankwise.train.config.rules import (
    CHOICES,
    check_choice,
    check_clip,
    check_final_wait,
    check_int,
    check_path,
    check_validation_split,
    fail,
    int_rule,
)
from rankwise.train.config.storage import check_checkpoint_key, check_storage_options
from rankwise.train.config.training import FIELDS, DistributedTrainingConfig, parse_overrides
from rankwise.train.config.tree import ConfigKeyError, ConfigTree

__all__ = [
    "CHOICES",
    "COMPILE_MODES",
    "FIELDS",
    "LOGGERS",
    "MLFLOW_OPTIONS",
    "TRACKERS",
    "ConfigKeyError",
    "ConfigTree",
    "DistributedTrainingConfig",
    "MlflowOptions",
    "check_checkpoint_key",
    "check_choice",
    "check_clip",
    "check_compile_options",
    "check_final_wait",
    "check_int",
    "check_logger_options",
    "check_loggers",
    "check_path",
    "check_storage_options",
    "check_validation_split",
    "check_yaml_values",
    "fail",
    "int_rule",
    "parse_overrides",
    "refuse_redacted",
]
