"""ConfigTree: nested YAML settings with attribute access and errors that name the path."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from rankwise.train import ConfigKeyError, ConfigTree


def test_from_file_nested_attributes_and_items(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  name: vae\n  sizes: [{width: 8}, {width: 4}]\nlr: 0.001\n")
    config = ConfigTree.from_file(path)
    assert config.model.name == "vae" and config["lr"] == 0.001
    assert config.model.sizes[1].width == 4
    assert "model" in config and "data" not in config and len(config) == 2
    config.model.latent_dim = 16
    config.data = {"path": "x"}
    assert config.data.path == "x"
    assert config.to_dict()["model"] == {
        "name": "vae", "sizes": [{"width": 8}, {"width": 4}], "latent_dim": 16
    }  # fmt: skip
    assert pickle.loads(pickle.dumps(config)) == config == copy.deepcopy(config)
    assert ConfigTree.from_file(_write(tmp_path, "")) == {}


def test_missing_key_names_the_path_and_the_keys_there() -> None:
    config = ConfigTree({"model": {"latent_dim": 4, "name": "vae"}})
    with pytest.raises(ConfigKeyError) as info:
        _ = config.model.latent_dims
    assert str(info.value) == (
        "config.model.latent_dims is not set (config.model has latent_dim, name); add it to "
        "the YAML file under model:, or set config.model.latent_dims = ... "
        "Did you mean 'latent_dim'?"
    )
    with pytest.raises(KeyError, match=r"config\.data is not set"):
        config["data"]
    assert getattr(config.model, "beta", 1.0) == 1.0 and not hasattr(config, "data")


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("- a\n- b\n", ValueError, r"holds a list, not a mapping"),
        ("model: [unclosed\n", ValueError, r"is not valid YAML"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, text: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ConfigTree.from_file(_write(tmp_path, text))


def test_missing_file_and_non_mapping_data() -> None:
    with pytest.raises(FileNotFoundError, match=r"config file 'nope\.yaml' not found"):
        ConfigTree.from_file("nope.yaml")
    with pytest.raises(TypeError, match=r"config must be a mapping .* got list"):
        ConfigTree([1, 2])  # type: ignore[arg-type]


def _write(folder: Path, text: str) -> Path:
    path = folder / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key", ["keys", "items", "get", "to_dict", "_data"])
def test_a_key_named_like_a_method_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match=rf"config\.model\.{key}: the key '{key}' clashes"):
        ConfigTree({"model": {key: 3}})
    config = ConfigTree({"model": {"size": 3}})
    with pytest.raises(ValueError, match=rf"rename it in the YAML file, e.g. to '{key}_'"):
        config.model[key] = 3
    assert config.model.to_dict() == {"size": 3}
