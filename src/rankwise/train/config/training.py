"""What a training run does: :class:`DistributedTrainingConfig`, with YAML in and out.

The CyxWiz guide builds the config with no arguments and sets fields one by one::

    config = DistributedTrainingConfig()
    config.epochs = 10
    config.batch_size = 64          # per rank

so the config checks itself on construction and again when ``fit`` starts (the trainer calls
:meth:`DistributedTrainingConfig.validate`). A run can also be described in a YAML file and
adjusted from the command line::

    config = DistributedTrainingConfig.from_yaml("run.yaml", overrides=["epochs=5"])

The rules of single fields live beside the fields they guard, one module per set:
:mod:`~rankwise.train.config.rules` (integers, booleans, paths, choices, numbers),
:mod:`~rankwise.train.config.storage` (the checkpoint store's options and key),
:mod:`~rankwise.train.config.loggers` (loggers and the trackers' options),
:mod:`~rankwise.train.config.compile` (torch.compile's arguments); the override strings are
parsed in :mod:`~rankwise.train.config.overrides`. The rules across fields are the config's
own methods, here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rankwise.storage import REDACTED, redacted
from rankwise.train.config.compile import check_compile_options
from rankwise.train.config.loggers import check_logger_options, check_loggers
from rankwise.train.config.overrides import parse_assignments
from rankwise.train.config.rules import check_fields, fail, int_rule
from rankwise.train.config.storage import check_checkpoint_key, check_storage_options
from rankwise.validation import did_you_mean


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
        check_fields(self)
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
            check_field_name(key)
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
    """``["epochs=5", "resume=auto"]`` -> ``{"epochs": 5, "resume": "auto"}`` (YAML scalars),
    each name checked to be a field.

    >>> parse_overrides(["epochs=5", "precision=bf16", "grad_clip_norm=null"])
    {'epochs': 5, 'precision': 'bf16', 'grad_clip_norm': None}
    """
    return parse_assignments(overrides, check_field_name)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DistributedTrainingConfig))


# -- checks -----------------------------------------------------------------------------------


def check_field_name(name: object) -> None:
    """Refuse ``name`` unless it is a field, naming the closest one."""
    if name in FIELDS:
        return
    hint = did_you_mean(name, FIELDS, text="did you mean {!r}? ", cutoff=0.5)
    raise ValueError(
        f"unknown DistributedTrainingConfig field {name!r}; {hint}"
        f"the fields are: {', '.join(FIELDS)}."
    )
