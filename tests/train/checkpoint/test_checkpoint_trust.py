"""No code from a checkpoint: every byte torch reads from a checkpoint has first been checked
against a manifest that lists every file of it, and with a checkpoint key that manifest carries
a valid MAC over its content and the checkpoint's name.

The property test is a tamper fuzzer: every tamper of ``rankwise.testing.tamper`` applied to
the newest of two checkpoints, for both kinds (a ``.pt`` file, a sharded ``.dcp`` folder), on
disk and in a real S3 bucket (SeaweedFS), with and without a key. Each tampered checkpoint is
refused by an explicit load with an error naming it and the fault, and skipped by
``resume="auto"`` (the previous checkpoint loads) with a warning saying the same; the planted
pickle payload never runs (its marker file never appears); and the untouched checkpoint
loads, so the test can fail both ways. Without a key, the tampers a checksum cannot see
(a rehash, a stripped or forged MAC) load: the documented limit.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from helpers.states import state_after
from rankwise.testing.tamper import DCP_ONLY, TAMPERS, tamper_checkpoint
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train import checkpoint as ck
from rankwise.train.checkpoint import (
    CheckpointError,
    CheckpointWarning,
    RemoteCheckpointManager,
    Storage,
)
from rankwise.train.checkpoint.manifests import KEY_VARIABLE, MAC
from rankwise.train.state import TrainState

pytestmark = pytest.mark.timeout(120)
KEY = "the-run-s-own-checkpoint-key"
NOT_MAC_FAULTS = {"flip-byte": "corrupt", "payload": "truncated|longer than written|corrupt"}
# What each tamper is refused with: without a key, and the MAC's word where a key sees it first.
UNKEYED = {
    ("file", "drop-entry"): "has no manifest",
    ("dcp", "drop-entry"): r"holds \.metadata, which its manifest does not list",
    ("dcp", "unlisted-file"): r"holds __9_0\.distcp, which its manifest does not list",
    ("file", "flip-byte"): "is corrupt",
    ("dcp", "flip-byte"): r"__0_0\.distcp is corrupt",
    ("file", "payload"): "truncated|longer than written",
    ("dcp", "payload"): r"\.metadata is (truncated|longer than written|corrupt)",
    ("file", "payload-unlisted"): "has no manifest",
    ("dcp", "payload-unlisted"): r"holds \.metadata, which its manifest does not list",
    ("file", "payload-rehashed"): "verifies but does not load",  # torch's weights_only
    ("file", "rename-step"): "is named for epoch 0 step 7, but its manifest",
    ("dcp", "rename-step"): "is named for epoch 0 step 7, but its manifest",
}
# Without a key these cannot be told from an honest checkpoint (docs/train.md says so); a
# sharded folder's payload-rehashed would run the payload: it is tested with a key only.
UNKEYED_LOADS = {"rehash", "strip-mac", "forge-mac"}
KEYED_NO_MAC = {"strip-mac": "carries no MAC"}


def _expected(kind: str, how: str, keyed: bool) -> str | None:
    """The error a tamper is refused with (None: it loads, the unkeyed limit)."""
    if not keyed:
        return None if how in UNKEYED_LOADS else UNKEYED[(kind, how)]
    if how in KEYED_NO_MAC:
        return KEYED_NO_MAC[how]
    if how in NOT_MAC_FAULTS or how == "unlisted-file":
        return UNKEYED[(kind, how)]  # the manifest is intact: its MAC holds
    if kind == "file" and how in ("drop-entry", "payload-unlisted"):
        return "has no manifest"  # the manifest itself is gone
    return "MAC does not match"


def _cases(kind: str, keyed: bool) -> list[str]:
    cases = [h for h in TAMPERS if kind == "dcp" or h not in DCP_ONLY]
    if not keyed and kind == "dcp":
        cases.remove("payload-rehashed")  # runs code without a key: the documented limit
    return cases


class Place:
    """A checkpoint folder on disk or in the bucket: its manager, locations, copies."""

    def __init__(self, where: str, root: str, kind: str) -> None:
        self.where, self.root, self.sharded = where, root, kind == "dcp"
        # one connection for the test (a new one costs half a second)
        self.store = None if where == "local" else Storage.for_url(root)

    def storage(self, at: str) -> Storage:
        assert self.store is not None
        return self.store.child(at.removeprefix(self.root).strip("/"))

    def manager(self, at: str, key: str | None) -> Any:
        if self.store is None:
            return ck.CheckpointManager(at, keep_last=None, sharded=self.sharded, key=key)
        return RemoteCheckpointManager(
            self.storage(at), keep_last=None, sharded=self.sharded, key=key
        )

    def read(self, location: str, key: str | None) -> dict[str, Any]:
        """An explicit load of ``location``: read_checkpoint's, or in the bucket its reader
        (backends.load_object / backends.fetch_folder) on this test's connection."""
        if self.store is None:
            return ck.read_checkpoint(location, key=key)
        return self.manager(location.rpartition("/")[0], key).read(location)

    def location(self, at: str, step: int) -> str:
        suffix = ".dcp" if self.sharded else ".pt"
        return f"{at}/ckpt-e000000-s{step:09d}{suffix}"

    def copy(self, source: str, name: str) -> str:
        target = f"{self.root}/{name}"
        if self.where == "local":
            shutil.copytree(source, target)
            return target
        src, dst = self.storage(source), self.storage(target)
        for key in src.names():
            dst.put(src.read(key), key)
        for folder in src.names(folders=True):
            for key in src.child(folder).names():
                dst.put(src.child(folder).read(key), f"{folder}/{key}")
        return target


def _pristine(place: Place, key: str | None) -> tuple[str, torch.Tensor]:
    """Two checkpoints (steps 1 and 2) under ``place``; the weights of step 2."""
    at = f"{place.root}/pristine"
    net = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    manager = place.manager(at, key)
    for step in (1, 2):
        state = state_after(net, optimizer, step)
        manager.save(state.state_dict(sharded=place.sharded), epoch=0, step=step)
    return at, net.weight.detach().clone()


def _load(location: str, state: dict[str, Any]) -> torch.Tensor:
    """Load ``state`` into a fresh model as ``fit`` does (a sharded one through DCP)."""
    net = nn.Linear(3, 2)
    TrainState(net, torch.optim.Adam(net.parameters(), lr=0.5)).load_state_dict(state, location)
    return net.weight.detach().clone()


def _refusal(
    location: str, how: str, expected: str, key: str | None, place: Place, auto: bool
) -> list[str]:
    """What is wrong with how ``location`` (tampered as ``how``) is treated: an explicit load
    must raise ``expected`` naming it; resume="auto" (if ``auto``) must skip it, saying so,
    for step 1."""
    problems = []
    try:
        _load(location, place.read(location, key))
        problems.append(f"{how}: an explicit load loaded it")
    except CheckpointError as e:
        if not re.search(expected, str(e)) or location not in str(e):
            problems.append(f"{how}: an explicit load raised {e!s:.300}, not {expected!r}")
    if not auto:
        return problems
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = place.manager(location.rpartition("/")[0], key).load_latest()
        if found is not None:
            _load(str(found[0]), found[1])
    said = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    if found is None or found[1]["step"] != 1:
        problems.append(f"{how}: resume='auto' found {found and found[0]}, not step 1")
    if not any(location in s and re.search(expected, s) for s in said):
        problems.append(f"{how}: resume='auto' said {said}, nothing naming it as {expected!r}")
    return problems


def _sweep(
    place: Place, kind: str, keyed: bool, marks: Path, only: set[str] | None = None
) -> list[str]:
    """Every tamper of ``kind`` (those in ``only``, if given) on a fresh copy of two
    checkpoints under ``place``: what went wrong (nothing, when the property holds)."""
    key = KEY if keyed else None
    pristine, weights = _pristine(place, key)
    problems: list[str] = []
    # untouched: it loads, explicitly and as the newest (the test can fail both ways)
    newest = place.location(pristine, 2)
    if not torch.equal(_load(newest, ck.read_checkpoint(newest, key=key)), weights):
        problems.append("the untouched checkpoint loaded other weights")
    found = place.manager(pristine, key).load_latest()
    if found is None or str(found[0]) != newest:
        problems.append(f"resume='auto' on the untouched run found {found and found[0]}")
    for how in (h for h in _cases(kind, keyed) if only is None or h in only):
        at = place.copy(pristine, f"{kind}-{key}-{how}")
        marker = marks / f"ran-{kind}-{keyed}-{how}"
        store = None if place.store is None else place.storage(at)
        tampered = tamper_checkpoint(place.location(at, 2), how, marker=marker, storage=store)
        expected = _expected(kind, how, keyed)
        if expected is None:  # unkeyed, a checksum cannot see it: it verifies (the limit)
            if str(place.manager(at, None).latest()) != place.location(at, 2):
                problems.append(f"{how}: unkeyed, it does not verify (the docs say it does)")
        else:
            problems += _refusal(tampered, how, expected, key, place, auto=place.store is None)
        if marker.exists():
            problems.append(f"{how}: the planted pickle RAN (code from a checkpoint)")
    if keyed:  # the right checkpoint, the wrong key: refused, every one of them
        try:
            place.read(newest, "another-key")
            problems.append("another key: an explicit load loaded it")
        except CheckpointError as e:
            if "MAC does not match" not in str(e) or newest not in str(e):
                problems.append(f"another key: an explicit load raised {e}")
        with pytest.warns(CheckpointWarning, match="MAC does not match"):
            if place.manager(pristine, "another-key").load_latest() is not None:
                problems.append("another key: resume='auto' found a checkpoint")
    return [f"{kind}, {'keyed' if keyed else 'unkeyed'}: {p}" for p in problems]


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("kind", ["file", "dcp"])
def test_every_tamper_is_refused_and_no_code_runs(kind: str, keyed: bool, tmp_path: Path) -> None:
    assert _sweep(Place("local", str(tmp_path), kind), kind, keyed, tmp_path) == []


def test_every_tamper_in_the_bucket_is_refused_and_no_code_runs(
    s3_bucket: str, tmp_path: Path
) -> None:
    """The sweep in a real S3 bucket (one bucket: a new one costs seconds to warm): every
    tamper with a key; without one, those a bucket's readers see with their own code (the
    object listing of a folder, the download of a file) rather than the shared checks. Loads
    are explicit: resume="auto" runs the same reader over each candidate (the untouched run
    and the wrong key still check it)."""
    unkeyed = {"file": {"payload-rehashed", "rename-step"}, "dcp": {"drop-entry", "unlisted-file"}}
    problems = []
    for kind in ("file", "dcp"):
        problems += _sweep(Place("s3", f"{s3_bucket}/{kind}-k", kind), kind, True, tmp_path)
        place = Place("s3", f"{s3_bucket}/{kind}-u", kind)
        problems += _sweep(place, kind, False, tmp_path, unkeyed[kind])
    assert problems == []


def test_a_sharded_folder_s_metadata_never_runs_code_even_unlisted(tmp_path: Path) -> None:
    """The issue's finding, alone: ``.metadata`` swapped for a pickle payload and dropped from
    the manifest ran the payload on load (main at 860b768); now the folder is refused."""
    place = Place("local", str(tmp_path), "dcp")
    pristine, _ = _pristine(place, None)
    marker = tmp_path / "ran"
    tampered = tamper_checkpoint(place.location(pristine, 2), "payload-unlisted", marker=marker)
    with pytest.raises(CheckpointError, match=r"holds \.metadata, which its manifest does not"):
        _load(tampered, ck.read_checkpoint(tampered))
    assert not marker.exists()


def test_a_renamed_checkpoint_is_refused_by_what_it_holds(tmp_path: Path) -> None:
    """A file renamed to another step, its manifest's meta rewritten to match (no key): the
    state inside still says step 2, so the name is refused."""
    manager = ck.CheckpointManager(tmp_path)
    manager.save({"epoch": 0, "step": 2}, epoch=0, step=2)
    moved = tmp_path / "ckpt-e000000-s000000009.pt"
    (tmp_path / "ckpt-e000000-s000000002.pt").rename(moved)
    manifest = json.loads((tmp_path / "ckpt-e000000-s000000002.pt.sha256.json").read_text())
    manifest["meta"]["step"] = 9
    ck.files.write_json_atomic(ck.manifest_path(moved), manifest)
    with pytest.raises(CheckpointError, match="named for epoch 0 step 9, but the state inside"):
        ck.read_checkpoint(moved)


def test_the_key_field_wins_over_the_environment_and_is_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, "the-environment-s-key")
    by_env = ck.CheckpointManager(tmp_path / "env").save({"step": 1}, epoch=0, step=1)
    by_field = ck.CheckpointManager(tmp_path / "field", key=KEY).save({"step": 1}, epoch=0, step=1)
    assert MAC in yaml.safe_load(ck.manifest_path(by_env).read_text())
    assert ck.read_checkpoint(by_env)["step"] == 1  # the environment's key, by default
    assert ck.read_checkpoint(by_field, key=KEY)["step"] == 1
    with pytest.raises(CheckpointError, match="MAC does not match") as raised:
        ck.read_checkpoint(by_field)  # the environment's key: not the one it was signed with
    assert str(by_field) in str(raised.value)
    monkeypatch.setenv(KEY_VARIABLE, "")
    with pytest.raises(ValueError, match=f"{KEY_VARIABLE} is empty"):
        ck.read_checkpoint(by_field)
    monkeypatch.delenv(KEY_VARIABLE)
    assert ck.read_checkpoint(by_field)["step"] == 1  # no key: checked as every unkeyed one
    cfg = DistributedTrainingConfig(checkpoint_key=KEY)
    shown = [repr(cfg), str(cfg.to_dict()), cfg.to_yaml(tmp_path / "c.yaml").read_text()]
    assert all(KEY not in text for text in shown) and cfg.to_dict()["checkpoint_key"] == "***"
    with pytest.raises(ValueError, match="redacted from a saved config"):
        DistributedTrainingConfig.from_yaml(tmp_path / "c.yaml")
    with pytest.raises(ValueError, match=r"checkpoint_key \(not shown\) is an empty string"):
        DistributedTrainingConfig(checkpoint_key="")


def test_fit_signs_its_checkpoints_and_resumes_only_under_its_key(tmp_path: Path) -> None:
    def fit(**kw: Any) -> DistributedTrainer:
        torch.manual_seed(0)
        trainer = DistributedTrainer(
            nn.Linear(4, 2), nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.1)
        )
        base: dict[str, Any] = dict(epochs=1, batch_size=8, verbose=False)
        cfg = DistributedTrainingConfig(**{**base, "checkpoint_dir": str(tmp_path), **kw})
        trainer.fit(torch.randn(16, 4), torch.randint(0, 2, (16,)), cfg)
        return trainer

    fit(checkpoint_key=KEY)
    saved = ck.CheckpointManager(tmp_path, key=KEY).latest()
    assert saved is not None and MAC in yaml.safe_load(ck.manifest_path(saved).read_text())
    assert fit(checkpoint_key=KEY, resume=str(saved), epochs=2).state.step == 4
    with pytest.raises(CheckpointError, match=f"{saved}: its manifest .*MAC does not match"):
        fit(checkpoint_key="another-key", resume=str(saved))
