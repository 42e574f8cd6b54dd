"""DistributedTrainingConfig: validation messages, dicts, YAML and overrides. Pure, no processes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.train.config import FIELDS, DistributedTrainingConfig, parse_overrides

# (field values, fragments the message must contain: the field, the value, the rule / fix)
BAD_VALUES: list[tuple[dict[str, Any], list[str]]] = [
    ({"epochs": 0}, ["epochs (0)", ">= 1"]),
    ({"epochs": 2.0}, ["epochs (2.0)", "integer", "pass 2"]),
    ({"epochs": True}, ["epochs (True)", "integer"]),
    ({"batch_size": -4}, ["batch_size (-4)", ">= 1", "per rank"]),
    ({"seed": -1}, ["seed (-1)", ">= 0"]),
    ({"seed": 2**64}, ["seed (18446744073709551616)", "2**64"]),
    ({"shuffle": "yes"}, ["shuffle ('yes')", "True or False"]),
    ({"verbose": 1}, ["verbose (1)", "True or False"]),
    ({"log_every_n_batches": -1}, ["log_every_n_batches (-1)", ">= 0", "0 turns"]),
    ({"checkpoint_every_n_epochs": -2}, ["checkpoint_every_n_epochs (-2)", ">= 0"]),
    ({"checkpoint_every_n_steps": "5"}, ["checkpoint_every_n_steps ('5')", "integer"]),
    ({"checkpoint_dir": ""}, ["checkpoint_dir ('')", "non-empty", "None turns"]),
    ({"checkpoint_storage_options": 5}, ["checkpoint_storage_options ('int')", "a dict"]),
    ({"checkpoint_key": ""}, ["checkpoint_key (not shown)", "an empty string", "or None"]),
    ({"checkpoint_dir": 3}, ["checkpoint_dir (3)", "path"]),
    ({"save_on_master_only": None}, ["save_on_master_only (None)", "True or False"]),
    ({"keep_last_checkpoints": 0}, ["keep_last_checkpoints (0)", ">= 1", "None to keep"]),
    ({"resume": 7}, ["resume (7)", "path", "'auto'"]),
    ({"resume": "auto", "checkpoint_dir": None}, ["resume ('auto')", "checkpoint_dir"]),
    ({"validation_split": 1.0}, ["validation_split (1.0)", "[0, 1)", "e.g. 0.1"]),
    ({"validation_split": -0.1}, ["validation_split (-0.1)", "[0, 1)"]),
    ({"validation_split": "0.1"}, ["validation_split ('0.1')", "[0, 1)"]),
    ({"precision": "fp64"}, ["precision ('fp64') must be one of 'fp32', 'bf16', 'fp16'"]),
    ({"precision": None}, ["precision (None)", "'fp32'"]),
    ({"grad_accum_steps": 0}, ["grad_accum_steps (0)", ">= 1", "no accumulation"]),
    ({"grad_clip_norm": 0.0}, ["grad_clip_norm (0.0)", "> 0", "None for no clipping"]),
    ({"grad_clip_norm": float("inf")}, ["grad_clip_norm (inf)", "finite"]),
    ({"lr_scaling": "sqrt"}, ["lr_scaling ('sqrt')", "'none', 'linear'"]),
    ({"lr_scaling": "linear"}, ["lr_scaling ('linear')", "base_batch_size", "e.g."]),
    ({"base_batch_size": 0}, ["base_batch_size (0)", ">= 1"]),
    ({"scheduler_interval": "batch"}, ["scheduler_interval ('batch')", "'step', 'epoch'"]),
    ({"num_workers": -1}, ["num_workers (-1)", ">= 0"]),
    ({"strategy": "dpp"}, ["strategy ('dpp')", "'ddp', 'fsdp', 'none'", "did you mean 'ddp'"]),
    ({"compression": "int8"}, ["compression ('int8')", "'powersgd'"]),
    ({"compression": "bf16", "strategy": "fsdp"}, ["compression ('bf16')", "strategy='ddp'"]),
    ({"gradient_checkpointing": "on"}, ["gradient_checkpointing ('on')", "True or False"]),
    ({"async_checkpoints": 1}, ["async_checkpoints (1)", "True or False"]),
    ({"checkpoint_final_wait_s": 0}, ["checkpoint_final_wait_s (0)", "finite number of seconds"]),
    ({"log_dir": b"logs"}, ["log_dir (b'logs')", "path"]),
    (
        {"loggers": ["csv", "wandbb"]},
        ["unknown logger 'wandbb'", "did you mean 'wandb'", "'mlflow'"],
    ),
    ({"loggers": "neptune"}, ["loggers ('neptune')", "unknown logger 'neptune'", "'csv'"]),
    ({"loggers": {"wandb": True}}, ["loggers ({'wandb': True})", "list of logger names"]),
    ({"loggers": ["csv"]}, ["loggers (['csv'])", "log_dir is None", "set log_dir"]),
    ({"logger_options": ["wandb"]}, ["logger_options ('list')", "dict of options per tracker"]),
    ({"logger_options": {"neptune": {}}}, ["logger_options ('neptune')", "'wandb', 'mlflow'"]),
    ({"logger_options": {"wandbb": {}}}, ["logger_options ('wandbb')", "did you mean 'wandb'"]),
    (
        {"loggers": ["mlflow"], "logger_options": {"mlflow": {"runname": "r"}}},
        ["logger_options (\"mlflow: 'runname'\")", "did you mean 'run_name'", "experiment_name"],
    ),
    ({"logger_options": {"wandb": "p"}}, ["logger_options ('wandb: str')", "must map to a dict"]),
    ({"logger_options": {"wandb": {"project": "p"}}}, ["logger_options ('wandb')", "add 'wandb'"]),
    (
        {"loggers": ["wandb"], "logger_options": {"wandb": {"settings": print}}},
        ["logger_options (\"wandb['settings']\")", "plain values"],
    ),
    (
        {"loggers": ["mlflow"], "logger_options": {"mlflow": {"tags": {"token": "***"}}}},
        ["logger_options['mlflow']['tags']['token'] is '***'", "MLFLOW_TRACKING_TOKEN"],
    ),
    ({"check_sync_every_n_steps": 0}, ["check_sync_every_n_steps (0)", ">= 1", "None for no"]),
    ({"check_sync_every_n_steps": 2.5}, ["check_sync_every_n_steps (2.5)", "integer"]),
    ({"compile": "yes"}, ["compile ('yes')", "True or False"]),
    ({"compile_options": "max-autotune"}, ["compile_options ('max-autotune')", "e.g. {'mode'"]),
    ({"compile_options": {"mdoe": "default"}}, ["unknown key 'mdoe'", "did you mean 'mode'"]),
    ({"compile_options": {"mode": "fast"}}, ["mode='fast'", "'max-autotune'"]),
    ({"compile_options": {"fullgraph": 1}}, ["fullgraph=1", "True or False"]),
    ({"compile_options": {"backend": print}}, ["backend=<built-in", "backend name string"]),
    ({"compile_options": {"dynamic": "auto"}}, ["dynamic='auto'", "None"]),
    ({"compile_options": {"options": {1: 2}}}, ["options={1: 2}", "string keys"]),
    (
        {"compile_options": {"mode": "max-autotune", "options": {"a": 1}}},
        ["sets both 'mode' and 'options'", "keep one"],
    ),
    ({"pin_memory": "cuda"}, ["pin_memory ('cuda')", "True or False"]),
    ({"prefetch_factor": 0, "num_workers": 2}, ["prefetch_factor (0)", ">= 1", "torch's default"]),
    ({"prefetch_factor": 4}, ["prefetch_factor (4)", "num_workers is 0", "prefetch_factor=None"]),
]


@pytest.mark.parametrize(("values", "fragments"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_bad_value_on_construction_names_field_value_and_fix(
    values: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        DistributedTrainingConfig(**values)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(("values", "fragments"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_bad_value_set_by_assignment_is_caught_by_validate(
    values: dict[str, Any], fragments: list[str]
) -> None:
    config = DistributedTrainingConfig()  # the CyxWiz guide's style: construct, then assign
    for name, value in values.items():
        setattr(config, name, value)
    with pytest.raises(ValueError) as info:
        config.validate()
    assert fragments[0] in str(info.value)


def test_every_field_is_covered_by_the_bad_value_table() -> None:
    covered = {name for values, _ in BAD_VALUES for name in values}
    assert covered == set(FIELDS)


def test_defaults_are_the_agreed_ones() -> None:
    config = DistributedTrainingConfig()
    assert config.to_dict() == {
        "epochs": 10,
        "batch_size": 32,
        "shuffle": True,
        "seed": 42,
        "verbose": True,
        "log_every_n_batches": 10,
        "checkpoint_every_n_epochs": 1,
        "checkpoint_every_n_steps": 0,
        "checkpoint_dir": "./checkpoints",
        "save_on_master_only": True,
        "keep_last_checkpoints": 3,
        "resume": None,
        "validation_split": 0.0,
        "precision": "fp32",
        "grad_accum_steps": 1,
        "grad_clip_norm": None,
        "lr_scaling": "none",
        "base_batch_size": None,
        "scheduler_interval": "epoch",
        "num_workers": 0,
        "strategy": "ddp",
        "compression": None,
        "gradient_checkpointing": False,
        "log_dir": None,
        "check_sync_every_n_steps": None,
        "async_checkpoints": True,
        "checkpoint_final_wait_s": 600.0,
        "compile": False,
        "compile_options": {},
        "pin_memory": True,
        "prefetch_factor": None,
        "checkpoint_storage_options": None,
        "checkpoint_key": None,
        "loggers": None,
        "logger_options": {},
    }


def test_validate_normalises_paths_case_and_numbers(tmp_path: Path) -> None:
    config = DistributedTrainingConfig(
        checkpoint_dir=tmp_path,  # type: ignore[arg-type]
        precision="BF16",
        compression="none",
        validation_split=0,
        grad_clip_norm=1,
    )
    assert config.checkpoint_dir == str(tmp_path)
    assert (config.precision, config.compression) == ("bf16", None)
    assert isinstance(config.validation_split, float) and isinstance(config.grad_clip_norm, float)
    assert config.validate() is config


@pytest.mark.parametrize(
    ("batch", "world", "accum", "expected"), [(32, 1, 1, 32), (64, 2, 1, 128), (16, 4, 3, 192)]
)
def test_effective_batch_size(batch: int, world: int, accum: int, expected: int) -> None:
    config = DistributedTrainingConfig(batch_size=batch, grad_accum_steps=accum)
    assert config.effective_batch_size(world) == expected


def test_effective_batch_size_refuses_a_bad_world_size() -> None:
    with pytest.raises(ValueError, match=r"world_size \(0\) must be >= 1"):
        DistributedTrainingConfig().effective_batch_size(0)


def test_lr_scale_follows_the_linear_rule_only_when_asked() -> None:
    assert DistributedTrainingConfig(batch_size=64).lr_scale(4) == 1.0
    linear = DistributedTrainingConfig(batch_size=32, lr_scaling="linear", base_batch_size=64)
    assert linear.lr_scale(1) == 0.5
    assert linear.lr_scale(4) == 2.0


def test_dict_round_trip_and_unknown_key_names_the_closest_field() -> None:
    config = DistributedTrainingConfig(epochs=3, precision="bf16", resume="auto")
    assert DistributedTrainingConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="'batchsize'; did you mean 'batch_size'"):
        DistributedTrainingConfig.from_dict({"batchsize": 8})
    with pytest.raises(ValueError, match="mapping"):
        DistributedTrainingConfig.from_dict([("epochs", 3)])  # type: ignore[arg-type]


def test_yaml_round_trip_keeps_every_field(tmp_path: Path) -> None:
    config = DistributedTrainingConfig(
        epochs=3,
        batch_size=17,
        shuffle=False,
        seed=7,
        checkpoint_dir=None,
        keep_last_checkpoints=None,
        validation_split=0.25,
        precision="fp16",
        grad_accum_steps=2,
        grad_clip_norm=0.5,
        lr_scaling="linear",
        base_batch_size=128,
        scheduler_interval="step",
        compression="powersgd",
        log_dir=str(tmp_path / "logs"),
        compile=True,
        compile_options={"mode": "max-autotune", "fullgraph": True, "dynamic": None},
        pin_memory=False,
        num_workers=2,
        prefetch_factor=4,
        loggers=["csv", "wandb"],
        logger_options={"wandb": {"project": "mnist", "tags": ["a", "b"]}},
    )
    path = config.to_yaml(tmp_path / "run.yaml")
    assert DistributedTrainingConfig.from_yaml(path) == config
    assert dataclasses.asdict(DistributedTrainingConfig.from_yaml(path)) == config.to_dict()


def test_yaml_overrides_are_yaml_scalars(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("epochs: 20\nprecision: bf16\ngrad_clip_norm: 1.0\n")
    config = DistributedTrainingConfig.from_yaml(
        path, overrides=("epochs=5", "grad_clip_norm=null", "resume=auto", "shuffle=false")
    )
    assert (config.epochs, config.precision, config.grad_clip_norm) == (5, "bf16", None)
    assert (config.resume, config.shuffle) == ("auto", False)
    assert config.batch_size == 32  # not in the file: the default


def test_loggers_from_a_command_line_and_logger_credentials_never_in_a_dump() -> None:
    config = DistributedTrainingConfig(log_dir="logs").with_overrides("loggers=csv,mlflow")
    assert config.loggers == ["csv", "mlflow"]
    assert config.logger_names() == ("csv", "mlflow")
    assert DistributedTrainingConfig(log_dir="logs").logger_names() == ("csv", "tensorboard")
    assert DistributedTrainingConfig().logger_names() == ()
    keyed = DistributedTrainingConfig(
        loggers=["wandb"], logger_options={"wandb": {"project": "p", "api_key": "k-123456"}}
    )
    assert keyed.to_dict()["logger_options"] == {"wandb": {"project": "p", "api_key": "***"}}
    assert keyed.logger_options["wandb"]["api_key"] == "k-123456"  # still used


@pytest.mark.parametrize(
    ("values", "where"),
    [
        (
            {"checkpoint_storage_options": {"key": "AKIA-EXAMPLE", "secret": "s-123456"}},
            "checkpoint_storage_options['key']",
        ),
        (
            {"checkpoint_storage_options": {"client_kwargs": {"aws_secret_access_key": "s-1"}}},
            "checkpoint_storage_options['client_kwargs']['aws_secret_access_key']",
        ),
        (
            {"loggers": ["wandb"], "logger_options": {"wandb": {"api_key": "k-123456"}}},
            "logger_options['wandb']['api_key']",
        ),
        (
            {"loggers": ["mlflow"], "logger_options": {"mlflow": {"tags": {"token": "t-1"}}}},
            "logger_options['mlflow']['tags']['token']",
        ),
    ],
)
def test_a_saved_config_with_a_redacted_credential_names_where_it_is(
    tmp_path: Path, values: dict[str, Any], where: str
) -> None:
    # Every credential a save redacts, at any depth, in either field: reading the file back
    # names the key that holds '***' (not "('options')"), the file, and the two fixes.
    path = DistributedTrainingConfig(log_dir="logs", **values).to_yaml(tmp_path / "run.yaml")
    with pytest.raises(ValueError) as info:
        DistributedTrainingConfig.from_yaml(path)
    message = str(info.value)
    assert f"DistributedTrainingConfig.{where} is '***'" in message
    assert "Put the real value there" in message and f"(config file {path})" in message
    key = where.rpartition("[")[2].rstrip("]")
    assert f"or leave {key} out" in message


def test_empty_yaml_file_gives_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set\n")
    assert DistributedTrainingConfig.from_yaml(path) == DistributedTrainingConfig()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("- epochs\n- 5\n", "must hold a YAML mapping"),
        ("epochs: [5\n", "is not valid YAML"),
        ("epochz: 5\n", "did you mean 'epochs'"),
        ("epochs: five\n", "epochs ('five')"),
    ],
)
def test_bad_yaml_file_is_named(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        DistributedTrainingConfig.from_yaml(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("epoch=5", "did you mean 'epochs'"),
        ("epochs", "'field=value'"),
        ("epochs=[1, 2]", "single value"),
        ("precision=fp64", "precision ('fp64')"),
    ],
)
def test_bad_override_is_named(override: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        DistributedTrainingConfig().with_overrides([override])


def test_with_overrides_returns_a_checked_copy() -> None:
    base = DistributedTrainingConfig(epochs=4)
    changed = base.with_overrides("batch_size=8")  # one string is one override
    assert (base.batch_size, changed.batch_size, changed.epochs) == (32, 8, 4)
    assert parse_overrides(["log_dir=", "seed=0x10"]) == {"log_dir": None, "seed": 16}


paths = st.one_of(
    st.none(),
    st.sampled_from(["null", "yes", "1e3", "~", "auto: x", "./ckpt # not a comment"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1).filter(
        str.strip
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    checkpoint_dir=paths,
    log_dir=paths,
    seed=st.integers(0, 2**64 - 1),
    split=st.floats(0, 1, exclude_max=True),
    clip=st.one_of(st.none(), st.floats(1e-6, 1e6)),
)
def test_yaml_round_trip_of_awkward_values(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoint_dir: str | None,
    log_dir: str | None,
    seed: int,
    split: float,
    clip: float | None,
) -> None:
    # Strings YAML would read as other types ("null", "yes", "1e3") must come back as strings.
    config = DistributedTrainingConfig(
        checkpoint_dir=checkpoint_dir,
        log_dir=log_dir,
        seed=seed,
        validation_split=split,
        grad_clip_norm=clip,
    )
    path = config.to_yaml(tmp_path_factory.mktemp("yaml") / "run.yaml")
    assert DistributedTrainingConfig.from_yaml(path) == config


# -- checkpoint_storage_options from YAML (issue 30): what fsspec/s3fs take, or an error
# naming the key ------------------------------------------------------------------------------

_KEYS = st.text(alphabet="abc_xyz", min_size=1, max_size=4)
_LEAVES = st.one_of(
    st.text(max_size=5), st.integers(), st.floats(allow_nan=False), st.booleans(), st.none()
)
_WRONG = st.one_of(st.lists(st.integers(), max_size=2), st.binary(max_size=3), st.dates())
_OPTIONS = st.recursive(
    st.one_of(_LEAVES, _WRONG),
    lambda inner: st.dictionaries(st.one_of(_KEYS, st.integers(0, 3)), inner, max_size=3),
    max_leaves=8,
)


def _wrong_places(item: Any, where: str = "options") -> list[str]:
    """Where ``item`` holds what storage options may not: a key that is not a string, or a
    value that is not a string, number, boolean, None or dict of those."""
    if isinstance(item, dict):
        places = [where for key in item if not isinstance(key, str)]
        for key, inner in item.items():
            places += _wrong_places(inner, f"{where}[{key!r}]")
        return places
    return [] if item is None or isinstance(item, str | int | float | bool) else [where]


@settings(max_examples=150, deadline=None)
@given(options=st.dictionaries(_KEYS, _OPTIONS, max_size=3))
def test_storage_options_from_yaml_are_checked_naming_the_key(tmp_path_factory, options):
    import yaml

    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_text(yaml.safe_dump({"checkpoint_storage_options": options}))
    read = yaml.safe_load(path.read_text())["checkpoint_storage_options"]
    wrong = _wrong_places(read)
    if not wrong:
        cfg = DistributedTrainingConfig.from_yaml(path)
        assert cfg.checkpoint_storage_options == read
        return
    with pytest.raises(ValueError, match="checkpoint_storage_options") as caught:
        DistributedTrainingConfig.from_yaml(path)
    assert any(place in str(caught.value) for place in wrong), (wrong, str(caught.value))
