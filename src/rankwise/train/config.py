"""What a training run does: :class:`DistributedTrainingConfig`, with YAML in and out.

Past 600 lines because the dataclass and the rules that guard its fields live together (the
field checks, the storage and tracker option checks, YAML in and out); issue 31 splits the
rule sets into a ``config/`` package beside the fields they guard.

The CyxWiz guide builds the config with no arguments and sets fields one by one::

    config = DistributedTrainingConfig()
    config.epochs = 10
    config.batch_size = 64          # per rank

so the config checks itself on construction and again when ``fit`` starts (the trainer calls
:meth:`DistributedTrainingConfig.validate`). A run can also be described in a YAML file and
adjusted from the command line::

    config = DistributedTrainingConfig.from_yaml("run.yaml", overrides=["epochs=5"])
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from rankwise.storage import REDACTED, redacted
from rankwise.validation import did_you_mean

# -- the rules of single fields (the rules across fields are the config's own methods) ------

# torch.compile's keyword arguments (besides the model) and what each takes. Kept as names and
# rules so a config file is checked before torch loads; compile_model passes them on as given.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_COMPILE_KEYS: dict[str, str] = {
    "fullgraph": "True or False (True: raise at a graph break instead of falling back)",
    "dynamic": "True, False or None (None: torch decides after a shape changes)",
    "backend": "a backend name string, e.g. 'inductor' (torch._dynamo.list_backends())",
    "mode": "None or one of " + ", ".join(repr(m) for m in COMPILE_MODES),
    "options": "a dict of inductor settings with string keys, e.g. {'triton.cudagraphs': False}",
    "disable": "True or False (True: run eagerly, e.g. to compare)",
}


def fail(name: str, value: Any, rule: str) -> NoReturn:
    raise ValueError(f"DistributedTrainingConfig.{name} ({value!r}) {rule}.")


def check_int(name: str, value: Any, low: int, hint: str) -> None:
    rule = int_rule(value, low, hint)
    if rule is not None:
        fail(name, value, rule)


def int_rule(value: Any, low: int, hint: str) -> str | None:
    """What is wrong with ``value`` as an integer >= ``low`` (None: nothing)."""
    if isinstance(value, bool) or not isinstance(value, int):
        whole = isinstance(value, float) and value.is_integer()
        fix = f"pass {int(value)}" if whole else hint
        return f"must be an integer >= {low}, got {type(value).__name__}; {fix}"
    if value < low:
        return f"must be >= {low}; {hint}"
    return None


def check_path(name: str, value: Any, hint: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        fail(name, value, f"must be a non-empty path string or None; {hint}")
    return str(value)


def check_validation_split(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        fail(
            "validation_split",
            value,
            "must be a fraction in [0, 1): the share of the training data held out for "
            "validation, e.g. 0.1; 0 holds out nothing",
        )
    return float(value)


def _positive_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float > 0 (a bool is not a number here)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )


def check_clip(value: Any) -> float | None:
    if value is None:
        return None
    if not _positive_number(value):
        fail(
            "grad_clip_norm",
            value,
            "must be a finite number > 0 (the largest total gradient norm, e.g. 1.0) "
            "or None for no clipping",
        )
    return float(value)


def check_final_wait(value: Any) -> float:
    """``checkpoint_final_wait_s``: a finite number of seconds > 0.

    >>> check_final_wait(600)
    600.0
    """
    if not _positive_number(value):
        fail(
            "checkpoint_final_wait_s",
            value,
            "must be a finite number of seconds > 0 (how long the end of fit waits for the "
            "last background checkpoint write, e.g. 600)",
        )
    return float(value)


def check_choice(name: str, value: Any, choices: tuple[str | None, ...]) -> str | None:
    if isinstance(value, str):
        lowered = value.strip().lower()
        # "none" written in YAML or on a command line means None where None is a choice.
        if lowered == "none" and None in choices and "none" not in choices:
            return None
        if lowered in choices:
            return lowered
    elif value is None and None in choices:
        return None
    names = ", ".join(repr(c) for c in choices)
    fail(
        name,
        value,
        f"must be one of {names}{did_you_mean(value, [str(c) for c in choices], ignore_case=True)}",
    )


_PLAIN_OPTION = (str, int, float, bool, type(None))


def check_yaml_values(name: str, item: Any, where: str) -> None:
    """Refuse anything in ``item`` (nested) but what YAML holds: string keys; strings,
    numbers, booleans, None, lists and dicts. ``where`` names the place in errors."""
    if isinstance(item, Mapping):
        for key, inner in item.items():
            if not isinstance(key, str):
                fail(name, where, f"has a key {key!r}; option names are strings")
            check_yaml_values(name, inner, f"{where}[{key!r}]")
    elif isinstance(item, list | tuple):
        for i, inner in enumerate(item):
            check_yaml_values(name, inner, f"{where}[{i}]")
    elif not isinstance(item, _PLAIN_OPTION):
        # the type only: the value may be a credential
        fail(
            name,
            where,
            f"holds a {type(item).__name__}; options are plain values (strings, numbers, "
            "booleans, None, lists, dicts) so a config stays a YAML file",
        )


def _storage_values(item: Any, where: str) -> None:
    """Refuse a list anywhere in storage options (fsspec's and s3fs's options take strings,
    numbers, booleans, None and dicts of those), naming the key."""
    if isinstance(item, Mapping):
        for key, inner in item.items():
            _storage_values(inner, f"{where}[{key!r}]")
    elif isinstance(item, list | tuple):
        fail(
            "checkpoint_storage_options",
            where,
            f"holds a {type(item).__name__}; the object store's options are strings, numbers, "
            "booleans, None or nested dicts of those (fsspec/s3fs take no lists): give this "
            "key one value",
        )


def check_storage_options(value: Any) -> dict[str, Any] | None:
    """``checkpoint_storage_options`` as a plain dict (string keys; strings, numbers, booleans,
    None and nested dicts of those: what fsspec and s3fs take), or None.

    >>> check_storage_options({"endpoint_url": "http://127.0.0.1:8333"})
    {'endpoint_url': 'http://127.0.0.1:8333'}
    """
    name = "checkpoint_storage_options"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        fail(
            name,
            type(value).__name__,
            "must be a dict of the object store's fsspec options, e.g. "
            "{'endpoint_url': 'https://s3.example.com'}, or None (the AWS_* variables and the "
            "provider's own files)",
        )
    check_yaml_values(name, value, "options")
    _storage_values(value, "options")
    options = dict(value)
    refuse_redacted(name, options, "the AWS_* variables or the provider's own files")
    return options


def check_checkpoint_key(value: Any) -> None:
    """Refuse a ``checkpoint_key`` that is not None or a non-empty string (the message never
    shows the value: it is a secret).

    >>> check_checkpoint_key("a-long-random-secret")
    """
    fix = (
        "give the secret as a string (e.g. the output of 'openssl rand -hex 32'), or None to "
        "take RANKWISE_CHECKPOINT_KEY from the environment (unset: unkeyed checkpoints)"
    )
    if value is None:
        return
    if not isinstance(value, str) or not value:
        what = "an empty string" if value == "" else f"a {type(value).__name__}"
        raise ValueError(f"DistributedTrainingConfig.checkpoint_key (not shown) is {what}: {fix}.")
    if value == REDACTED:
        raise ValueError(
            f"DistributedTrainingConfig.checkpoint_key holds {REDACTED!r}, the key redacted from "
            f"a saved config: {fix}."
        )


# The loggers a run may write to: rankwise's own files, and the experiment trackers
# (rankwise.train.trackers), each configured by its own variables plus logger_options.
LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
TRACKERS = ("wandb", "mlflow")  # the loggers that take logger_options
# The options rankwise's MLflow tracker reads (W&B's are wandb.init's arguments, checked
# against its signature where wandb is imported: rankwise.train.trackers).
MLFLOW_OPTIONS = ("tracking_uri", "experiment_name", "experiment_id", "run_name", "tags")


def check_loggers(value: Any) -> list[str] | None:
    """``loggers`` as a list of names from :data:`LOGGERS` (repeats dropped), or None.

    A string is a comma-separated list (``loggers=csv,wandb`` on a command line).

    >>> check_loggers("csv, wandb"), check_loggers(["MLflow", "csv", "mlflow"])
    (['csv', 'wandb'], ['mlflow', 'csv'])
    """
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        fail("loggers", value, f"must be a list of logger names from {LOGGERS}, or None")
    names: list[str] = []
    for item in items:
        name = item.strip().lower() if isinstance(item, str) else item
        if name not in LOGGERS:
            choices = ", ".join(repr(c) for c in LOGGERS)
            fail(
                "loggers",
                value,
                f"has an unknown logger {item!r}{did_you_mean(name, LOGGERS, ignore_case=True)}; the loggers "
                f"are {choices} (None: "
                "'csv' and 'tensorboard' when log_dir is set)",
            )
        if name not in names:
            names.append(name)
    return names


def check_logger_options(value: Any) -> dict[str, Any]:
    """``logger_options`` as ``{tracker: {option: plain value}}`` for the trackers in
    :data:`TRACKERS` (W&B's ``wandb.init`` arguments, MLflow's experiment and run names).

    >>> check_logger_options({"wandb": {"project": "mnist"}})
    {'wandb': {'project': 'mnist'}}
    """
    name = "logger_options"
    if value is None:
        return {}
    example = "e.g. {'wandb': {'project': 'mnist'}, 'mlflow': {'experiment_name': 'mnist'}}"
    if not isinstance(value, Mapping):
        fail(name, type(value).__name__, f"must be a dict of options per tracker, {example}")
    for tracker, options in value.items():
        if tracker not in TRACKERS:
            trackers = ", ".join(repr(t) for t in TRACKERS)
            fail(
                name,
                tracker,
                f"is not a tracker that takes options{did_you_mean(tracker, TRACKERS, ignore_case=True)}; the "
                f"keys are {trackers} ({example})",
            )
        if not isinstance(options, Mapping):
            fail(name, f"{tracker}: {type(options).__name__}", f"must map to a dict, {example}")
        if tracker == "mlflow":
            for key in options:
                if key not in MLFLOW_OPTIONS:
                    fail(
                        name,
                        f"mlflow: {key!r}",
                        f"is not an MLflow option{did_you_mean(key, MLFLOW_OPTIONS, ignore_case=True)}; they are "
                        f"{', '.join(MLFLOW_OPTIONS)} (the rest is MLflow's own variables: "
                        "MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, ...)",
                    )
        check_yaml_values(name, options, tracker)
        refuse_redacted(
            f"{name}[{tracker!r}]",
            options,
            "the tracker's own variables (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...)",
        )
    return {tracker: dict(options) for tracker, options in value.items()}


def refuse_redacted(name: str, options: Mapping[str, Any], elsewhere: str) -> None:
    """Refuse the first ``"***"`` in ``options`` (nested), naming where it is: a config read
    back from a saved one (``to_yaml``, a checkpoint's copy) has its credentials redacted.

    >>> try:
    ...     refuse_redacted("logger_options['wandb']", {"api_key": "***"}, "WANDB_API_KEY")
    ... except ValueError as exc:
    ...     print(str(exc)[:60])
    DistributedTrainingConfig.logger_options['wandb']['api_key']
    """
    for key, item in options.items():
        where = f"{name}[{key!r}]"
        if isinstance(item, Mapping):
            refuse_redacted(where, item, elsewhere)
        elif item == REDACTED:
            field = name.partition("[")[0]
            raise ValueError(
                f"DistributedTrainingConfig.{where} is {REDACTED!r}: a saved config (to_yaml, "
                f"a checkpoint's copy) holds {REDACTED!r} in place of each credential, never "
                f"the credential. Put the real value there (in the file, or an override "
                f"{field}=...), or leave {key!r} out and let {elsewhere} supply it."
            )


def check_compile_options(value: Any) -> dict[str, Any]:
    """``compile_options`` as a plain dict of torch.compile keyword arguments.

    >>> check_compile_options({"mode": "max-autotune", "fullgraph": True})
    {'mode': 'max-autotune', 'fullgraph': True}
    """
    name = "compile_options"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail(
            name, value, "must be a dict of torch.compile arguments, e.g. {'mode': 'max-autotune'}"
        )
    options = dict(value)
    for key, item in options.items():
        if key not in _COMPILE_KEYS:
            guess = did_you_mean(key, list(_COMPILE_KEYS), text="did you mean {!r}? ")
            keys = ", ".join(repr(k) for k in _COMPILE_KEYS)
            fail(name, value, f"has an unknown key {key!r}; {guess}the keys are {keys}")
        if not _compile_value_ok(key, item):
            fail(name, value, f"has {key}={item!r}; {key} must be {_COMPILE_KEYS[key]}")
    if options.get("mode") is not None and options.get("options") is not None:
        fail(
            name,
            value,
            "sets both 'mode' and 'options', which torch.compile refuses; keep one (a mode "
            "is a preset of options)",
        )
    return options


def _compile_value_ok(key: str, item: Any) -> bool:
    if key in ("fullgraph", "disable"):
        return isinstance(item, bool)
    if key == "dynamic":
        return item is None or isinstance(item, bool)
    if key == "backend":
        return isinstance(item, str) and bool(item.strip())
    if key == "mode":
        return item is None or item in COMPILE_MODES
    return item is None or (isinstance(item, Mapping) and all(isinstance(k, str) for k in item))


# The choices of each string field. Precision names are rankwise.parallel.Precision's modes,
# compression names DDPConfig's; they are repeated here so that a config can be read and checked
# without importing the engine.
CHOICES: dict[str, tuple[str | None, ...]] = {
    "precision": ("fp32", "bf16", "fp16"),
    "lr_scaling": ("none", "linear"),
    "scheduler_interval": ("step", "epoch"),
    "strategy": ("ddp", "fsdp", "none"),
    "compression": (None, "fp16", "bf16", "powersgd"),
}

# Integer fields: (smallest allowed value, what the value means / how to turn it off).
_INTS: dict[str, tuple[int, str]] = {
    "epochs": (1, "the number of passes over the data, e.g. 10"),
    "batch_size": (1, "samples per rank per micro-batch, e.g. 32"),
    "seed": (0, "any non-negative integer, e.g. 42"),
    "log_every_n_batches": (0, "0 turns step lines off"),
    "checkpoint_every_n_epochs": (0, "0 turns epoch checkpoints off"),
    "checkpoint_every_n_steps": (0, "counted in optimizer steps; 0 turns them off"),
    "grad_accum_steps": (1, "1 means no accumulation"),
    "num_workers": (0, "DataLoader worker processes per rank; 0 loads in the main process"),
}
_OPTIONAL_INTS: dict[str, tuple[int, str]] = {
    "keep_last_checkpoints": (1, "e.g. 3, or None to keep every checkpoint"),
    "base_batch_size": (1, "the global batch size the learning rate was tuned for, e.g. 64"),
    "check_sync_every_n_steps": (1, "counted in optimizer steps, e.g. 100, or None for no check"),
    "prefetch_factor": (
        1,
        "batches each loader worker prepares ahead, e.g. 4, or None for torch's default",
    ),
}
_BOOLS = (
    "shuffle",
    "verbose",
    "save_on_master_only",
    "gradient_checkpointing",
    "async_checkpoints",
    "compile",
    "pin_memory",
)
_OPTIONAL_PATHS: dict[str, str] = {
    "checkpoint_dir": "None turns checkpoints off",
    "resume": "None starts fresh, 'auto' resumes from the newest checkpoint in checkpoint_dir",
    "log_dir": "None turns the CSV and TensorBoard logs off (the trackers in loggers still log)",
}
_MAX_SEED = 2**64 - 1  # torch.manual_seed's range


@dataclasses.dataclass
class DistributedTrainingConfig:
    """Every setting of :class:`~rankwise.train.DistributedTrainer`'s ``fit``.

    Mutable on purpose (the CyxWiz guide assigns fields after construction); checked on
    construction and again by :meth:`validate`. ``batch_size`` is per rank; one optimizer step
    sees ``effective_batch_size(world_size)`` samples. See ``docs/train.md`` ("Configuration")
    for the rule of every field.

    >>> config = DistributedTrainingConfig(batch_size=32, grad_accum_steps=2)
    >>> config.effective_batch_size(world_size=4)
    256
    >>> DistributedTrainingConfig(precision="fp64")
    Traceback (most recent call last):
    ...
    ValueError: DistributedTrainingConfig.precision ('fp64') must be one of 'fp32', 'bf16', 'fp16'...
    """

    epochs: int = 10
    batch_size: int = 32  # per rank
    shuffle: bool = True
    seed: int = 42
    verbose: bool = True
    log_every_n_batches: int = 10  # 0 = off
    checkpoint_every_n_epochs: int = 1  # 0 = off
    checkpoint_every_n_steps: int = 0  # optimizer steps; 0 = off
    checkpoint_dir: str | None = "./checkpoints"  # None = no checkpoints; or an fsspec URL
    # object store options (fsspec: endpoint_url, key, secret, ...); None = AWS_* / files
    checkpoint_storage_options: dict[str, Any] | None = None
    # the secret that signs checkpoint manifests (HMAC); None = RANKWISE_CHECKPOINT_KEY, or none
    checkpoint_key: str | None = dataclasses.field(default=None, repr=False)
    save_on_master_only: bool = True
    keep_last_checkpoints: int | None = 3  # None = keep all
    resume: str | None = None  # None | "auto" | a checkpoint path
    validation_split: float = 0.0  # [0, 1): deterministic hold-out (seeded)
    precision: str = "fp32"  # "fp32" | "bf16" | "fp16"
    grad_accum_steps: int = 1
    grad_clip_norm: float | None = None
    lr_scaling: str = "none"  # "none" | "linear"
    base_batch_size: int | None = None  # required for lr_scaling="linear"
    scheduler_interval: str = "epoch"  # "step" | "epoch"
    num_workers: int = 0
    strategy: str = "ddp"  # "ddp" | "fsdp" | "none"
    compression: str | None = None  # None | "fp16" | "bf16" | "powersgd"
    gradient_checkpointing: bool = False
    log_dir: str | None = None  # CSV (+ TensorBoard if installed); None = off
    # "csv", "tensorboard", "wandb", "mlflow"; None = csv + tensorboard when log_dir is set
    loggers: list[str] | None = None
    # per tracker: {"wandb": {"project": ...}, "mlflow": {"experiment_name": ...}}
    logger_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    check_sync_every_n_steps: int | None = None  # compare parameters across ranks; None = off
    async_checkpoints: bool = True  # write checkpoints in the background (False: on the loop)
    # seconds the end of fit waits for the last background write, then fails naming it
    checkpoint_final_wait_s: float = 600.0
    compile: bool = False  # torch.compile the model after wrapping (parallel.compile_model)
    compile_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # torch.compile(**)
    pin_memory: bool = True  # page-locked batches for async copies; only on CUDA
    prefetch_factor: int | None = None  # batches per loader worker ahead; None = torch's

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> DistributedTrainingConfig:
        """Check every field; raise ``ValueError`` naming the field, the value and the fix.

        Normalises as it goes: paths become ``str``, choice names lower case, whole-number
        floats stay floats (``validation_split=0`` becomes ``0.0``). Returns ``self``.
        """
        for name, (low, hint) in _INTS.items():
            check_int(name, getattr(self, name), low, hint)
        if self.seed > _MAX_SEED:
            fail("seed", self.seed, "must be <= 2**64 - 1 (torch's seed range); use seed % 2**64")
        for name, (low, hint) in _OPTIONAL_INTS.items():
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), low, hint)
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                fail(name, getattr(self, name), "must be True or False")
        for name, hint in _OPTIONAL_PATHS.items():
            setattr(self, name, check_path(name, getattr(self, name), hint))
        self.validation_split = check_validation_split(self.validation_split)
        self.grad_clip_norm = check_clip(self.grad_clip_norm)
        self.checkpoint_final_wait_s = check_final_wait(self.checkpoint_final_wait_s)
        for name, choices in CHOICES.items():
            setattr(self, name, check_choice(name, getattr(self, name), choices))
        self.compile_options = check_compile_options(self.compile_options)
        self.checkpoint_storage_options = check_storage_options(self.checkpoint_storage_options)
        check_checkpoint_key(self.checkpoint_key)
        self.loggers = check_loggers(self.loggers)
        self.logger_options = check_logger_options(self.logger_options)
        self.check_combinations()
        return self

    # -- the rules across fields: every rule that compares a field with another (or with how
    # the job runs, or with an earlier fit's config) lives here and nowhere else ----------------

    def check_combinations(self, *, continue_mode: bool = False) -> None:
        """Refuse fields that contradict each other. ``continue_mode``: the job runs under
        ``rankwise launch --on-failure continue`` (checked when ``fit`` starts there)."""
        if self.lr_scaling == "linear" and self.base_batch_size is None:
            fail(
                "lr_scaling",
                self.lr_scaling,
                "needs base_batch_size (the global batch size the learning rate was tuned "
                "for, e.g. base_batch_size=64), or set lr_scaling='none'",
            )
        if self.compression is not None and self.strategy != "ddp":
            fail(
                "compression",
                self.compression,
                f"compresses DDP's gradient all-reduce, but strategy is {self.strategy!r}; "
                "set compression=None or strategy='ddp'",
            )
        if self.strategy == "fsdp" and not self.save_on_master_only and self.checkpoint_dir:
            fail(
                "save_on_master_only",
                self.save_on_master_only,
                "would give each rank its own checkpoint folder, but strategy='fsdp' writes "
                "one sharded checkpoint that every rank writes its part of, in a checkpoint_dir "
                "every rank sees (a shared filesystem); set save_on_master_only=True",
            )
        if self.prefetch_factor is not None and self.num_workers == 0:
            fail(
                "prefetch_factor",
                self.prefetch_factor,
                "counts the batches each DataLoader worker loads ahead, but num_workers is 0 "
                "(batches load in the main process); set num_workers > 0 or prefetch_factor=None",
            )
        if self.resume == "auto" and self.checkpoint_dir is None:
            fail(
                "resume",
                self.resume,
                "looks for the newest checkpoint in checkpoint_dir, which is None; "
                "set checkpoint_dir or pass a checkpoint path",
            )
        if self.strategy == "fsdp" and self.check_sync_every_n_steps:
            fail(
                "check_sync_every_n_steps",
                self.check_sync_every_n_steps,
                "compares the ranks' replicas of every parameter, but strategy='fsdp' shards "
                "every parameter (each element lives on one rank), so there is no replica to "
                "compare and the check would pass without checking anything; set "
                "check_sync_every_n_steps=None, or use strategy='ddp' to check replicas",
            )
        for name in ("csv", "tensorboard"):
            if self.loggers is not None and name in self.loggers and self.log_dir is None:
                fail(
                    "loggers",
                    self.loggers,
                    f"lists {name!r}, which writes into log_dir, but log_dir is None; set "
                    f"log_dir or leave {name!r} out",
                )
        for tracker in self.logger_options:
            if tracker not in self.logger_names():
                fail(
                    "logger_options",
                    tracker,
                    f"configures a tracker that loggers ({self.loggers!r}) does not list; add "
                    f"{tracker!r} to loggers or drop its options",
                )
        if continue_mode and self.strategy == "fsdp":
            fail(
                "strategy",
                self.strategy,
                "cannot train on through a lost rank (rankwise launch --on-failure continue): "
                "FSDP2 shards the parameters and the optimizer state over the ranks, so a lost "
                "rank takes its shard with it and the survivors cannot go on without reading a "
                "checkpoint. Use strategy='ddp' (every rank holds the whole model), or launch "
                "with --on-failure restart and checkpoint_dir set (the world restarts from the "
                "last checkpoint)",
            )

    def logger_names(self) -> tuple[str, ...]:
        """The loggers this run writes to: ``loggers``, or (None) ``csv`` and ``tensorboard``
        when ``log_dir`` is set.

        >>> DistributedTrainingConfig(log_dir="logs").logger_names()
        ('csv', 'tensorboard')
        >>> DistributedTrainingConfig(loggers=["mlflow"]).logger_names()
        ('mlflow',)
        """
        if self.loggers is not None:
            return tuple(self.loggers)
        return ("csv", "tensorboard") if self.log_dir is not None else ()

    def check_refit(self, earlier: DistributedTrainingConfig) -> None:
        """A later ``fit`` of the same trainer keeps the first fit's wrapping and compiling
        (``earlier``: the config the model was prepared with)."""
        for name in ("strategy", "compile"):
            was, now = getattr(earlier, name), getattr(self, name)
            if was != now:
                raise ValueError(
                    f"this trainer's model was prepared with {name}={was!r} by an earlier "
                    f"fit(); config.{name} is {now!r}. Keep the {name} or build a new "
                    "DistributedTrainer."
                )

    def effective_batch_size(self, world_size: int) -> int:
        """Samples per optimizer step over all ranks: ``batch_size * world_size * grad_accum_steps``.

        >>> DistributedTrainingConfig(batch_size=64).effective_batch_size(2)
        128
        """
        rule = int_rule(world_size, 1, "pass the number of ranks, e.g. rd.get_world_size()")
        if rule is not None:
            raise ValueError(f"world_size ({world_size!r}) {rule}.")
        return self.batch_size * world_size * self.grad_accum_steps

    def lr_scale(self, world_size: int) -> float:
        """The factor the learning rate is multiplied by: ``effective / base_batch_size`` under
        ``lr_scaling="linear"`` (the linear scaling rule), else 1.0.

        >>> DistributedTrainingConfig(batch_size=64, lr_scaling="linear",
        ...                           base_batch_size=64).lr_scale(world_size=4)
        4.0
        """
        effective = self.effective_batch_size(world_size)
        if self.lr_scaling == "linear" and self.base_batch_size is not None:
            return effective / self.base_batch_size
        return 1.0

    # -- dicts and YAML ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain values by field name (what ``to_yaml`` writes and checkpoints keep), with the
        credentials in ``checkpoint_storage_options`` and ``logger_options``, and the
        ``checkpoint_key``, shown as ``"***"``: they never reach a file, a log or a checkpoint.

        >>> DistributedTrainingConfig(checkpoint_storage_options={"secret": "abc123"}
        ...                           ).to_dict()["checkpoint_storage_options"]
        {'secret': '***'}
        """
        values = dataclasses.asdict(self)
        if self.checkpoint_storage_options is not None:
            values["checkpoint_storage_options"] = redacted(self.checkpoint_storage_options)
        if self.checkpoint_key is not None:
            values["checkpoint_key"] = REDACTED
        values["logger_options"] = redacted(self.logger_options)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DistributedTrainingConfig:
        """A config from ``{field: value}``; missing fields keep their defaults.

        >>> DistributedTrainingConfig.from_dict({"epochs": 3}).epochs
        3
        >>> DistributedTrainingConfig.from_dict({"epoch": 3})
        Traceback (most recent call last):
        ...
        ValueError: unknown DistributedTrainingConfig field 'epoch'; did you mean 'epochs'? ...
        """
        if not isinstance(values, Mapping):
            raise ValueError(
                f"DistributedTrainingConfig.from_dict needs a mapping of field names to values, "
                f"got {type(values).__name__}; pass e.g. {{'epochs': 5}}."
            )
        for key in values:
            _check_field_name(key)
        return cls(**dict(values))

    def with_overrides(self, overrides: Iterable[str] | str) -> DistributedTrainingConfig:
        """A copy with ``"field=value"`` strings applied, values parsed as YAML scalars.

        >>> c = DistributedTrainingConfig().with_overrides(["epochs=5", "grad_clip_norm=1"])
        >>> c.epochs, c.grad_clip_norm
        (5, 1.0)
        """
        # asdict, not to_dict: the copy keeps the credentials to_dict redacts
        return self.from_dict({**dataclasses.asdict(self), **parse_overrides(overrides)})

    def to_yaml(self, path: str | os.PathLike[str]) -> Path:
        """Write every field to a YAML file (``from_yaml`` reads it back); returns the path."""
        path = Path(path)
        header = "# rankwise DistributedTrainingConfig (docs/train.md, 'Configuration')\n"
        path.write_text(header + yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path

    @classmethod
    def from_yaml(
        cls, path: str | os.PathLike[str], overrides: Iterable[str] | str = ()
    ) -> DistributedTrainingConfig:
        """Read a YAML mapping of fields, then apply ``"field=value"`` overrides.

        ``overrides`` are parsed as YAML scalars: ``"epochs=5"`` is the int 5,
        ``"precision=bf16"`` the string, ``"grad_clip_norm=null"`` None.
        """
        path = Path(path)
        try:
            values = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from exc
        if values is None:  # an empty file: all defaults
            values = {}
        if not isinstance(values, dict):
            raise ValueError(
                f"{path} must hold a YAML mapping of config fields (e.g. 'epochs: 5'), "
                f"but its top level is a {type(values).__name__}."
            )
        try:
            return cls.from_dict({**values, **parse_overrides(overrides)})
        except ValueError as exc:
            raise ValueError(f"{exc} (config file {path})") from None


def parse_overrides(overrides: Iterable[str] | str) -> dict[str, Any]:
    """``["epochs=5", "resume=auto"]`` -> ``{"epochs": 5, "resume": "auto"}`` (YAML scalars).

    >>> parse_overrides(["epochs=5", "precision=bf16", "grad_clip_norm=null"])
    {'epochs': 5, 'precision': 'bf16', 'grad_clip_norm': None}
    """
    if isinstance(overrides, str):  # one override, not a sequence of characters
        overrides = [overrides]
    parsed: dict[str, Any] = {}
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"override {item!r} must be a 'field=value' string, e.g. 'epochs=5'.")
        name, _, text = item.partition("=")
        name = name.strip()
        _check_field_name(name)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"override {item!r}: {text!r} is not a YAML scalar ({exc}).") from exc
        if isinstance(value, dict | list):
            raise ValueError(
                f"override {item!r} must set a single value, got a {type(value).__name__}; "
                "quote the value if it is a string."
            )
        parsed[name] = value
    return parsed


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DistributedTrainingConfig))


# -- checks -----------------------------------------------------------------------------------


def _check_field_name(name: object) -> None:
    if name in FIELDS:
        return
    hint = did_you_mean(name, FIELDS, text="did you mean {!r}? ", cutoff=0.5)
    raise ValueError(
        f"unknown DistributedTrainingConfig field {name!r}; {hint}"
        f"the fields are: {', '.join(FIELDS)}."
    )
