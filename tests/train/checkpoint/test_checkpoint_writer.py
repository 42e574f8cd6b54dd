"""Background checkpoints inside ``fit`` (the checkpoint package's writer): the loop goes on
while the writer thread writes, ``fit`` returns only once the last checkpoint is durable, and
an exception or SIGTERM still lets the write in flight land.

The writes are slowed or held with the checkpoint fault hook (``set_fault_hook``), which the
writer thread calls at each point of a save; no timing is asserted, only the order of events.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.training import classification, make_trainer, mlp
from rankwise.testing import child_env, run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import CheckpointManager, set_fault_hook, verify_file


def _config(folder: Path, **kwargs: Any) -> DistributedTrainingConfig:
    values: dict[str, Any] = dict(
        epochs=1, batch_size=8, verbose=False, checkpoint_dir=str(folder), keep_last_checkpoints=10
    )
    values.update(kwargs)
    return DistributedTrainingConfig(**values)


@pytest.fixture
def fault_hook() -> Iterator[Callable[[Callable[[str], None]], None]]:
    def install(hook: Callable[[str], None]) -> None:
        set_fault_hook(hook)

    yield install
    set_fault_hook(None)


def _pointer_step(folder: Path) -> int:
    latest = CheckpointManager(folder).latest()
    assert latest is not None
    name = json.loads((folder / "ckpt-latest.json").read_text())["file"]
    assert name == latest.name  # the pointer moved to the newest valid file
    return int(latest.stem.split("-s")[1])


def test_the_loop_goes_on_while_the_writer_writes(tmp_path, fault_hook) -> None:
    # The first write (step 2) is held before its rename until the loop builds step 4; a
    # synchronous save would hold the loop there and the wait would time out.
    trainer = make_trainer(mlp(6, 8, 3))
    steps_seen: list[int] = []
    moved_on = threading.Event()
    writer_threads: set[str] = set()

    def on_batch(trainer: DistributedTrainer, epoch: int, step: int, ids: Any) -> None:
        steps_seen.append(step)
        if step >= 3:  # building step 4
            moved_on.set()

    def hold_first_write(point: str) -> None:
        writer_threads.add(threading.current_thread().name)
        if point == "before-rename" and not moved_on.is_set():
            assert moved_on.wait(30), "the loop did not go on while the checkpoint was written"

    trainer.on_batch = on_batch
    fault_hook(hold_first_write)
    trainer.fit(*classification(64, 6, 3, seed=1), _config(tmp_path, checkpoint_every_n_steps=2))
    assert threading.current_thread().name not in writer_threads  # written off the loop
    assert _pointer_step(tmp_path) == 8  # the last save (end of fit) is durable
    stats = trainer.checkpoint_stats
    assert stats is not None and stats.saves == 4  # steps 2, 4, 6 and 8 (as the start of epoch 1)
    assert stats.blocked_seconds > 0 and stats.waited_seconds <= stats.blocked_seconds


def test_synchronous_saves_write_on_the_training_thread(tmp_path, fault_hook) -> None:
    threads: set[str] = set()
    fault_hook(lambda point: threads.add(threading.current_thread().name))
    trainer = make_trainer(mlp(6, 8, 3))
    cfg = _config(tmp_path, checkpoint_every_n_steps=4, async_checkpoints=False)
    trainer.fit(*classification(64, 6, 3, seed=1), cfg)
    assert threads == {threading.current_thread().name}
    assert _pointer_step(tmp_path) == 8
    assert trainer.checkpoint_stats is not None and trainer.checkpoint_stats.waits == 0


def test_fit_returns_only_once_the_last_checkpoint_is_durable(tmp_path, fault_hook) -> None:
    # The writer is slowed before it moves the pointer; when fit returns, the pointer must
    # already name the last step, and the callback must have been told.
    saved: list[Path] = []

    class Saved:
        def on_checkpoint_saved(self, trainer: DistributedTrainer, path: Path) -> None:
            assert path.exists() and CheckpointManager(tmp_path).latest() is not None
            saved.append(path)

    def slow_pointer(point: str) -> None:
        if point == "before-pointer":
            time.sleep(0.5)

    fault_hook(slow_pointer)
    trainer = make_trainer(mlp(6, 8, 3), callbacks=[Saved()])
    trainer.fit(
        *classification(64, 6, 3, seed=1), _config(tmp_path, epochs=2, checkpoint_every_n_epochs=1)
    )
    assert _pointer_step(tmp_path) == 16
    assert [p.name for p in saved] == ["ckpt-e000001-s000000008.pt", "ckpt-e000002-s000000016.pt"]


def test_on_epoch_saved_comes_once_the_epochs_checkpoint_is_durable(tmp_path, fault_hook):
    # What RayReport builds on: a background write is waited for before the callback hears of
    # the epoch, so the path it hands on (to Ray) is a verified checkpoint of that very epoch.
    # An epoch that saves nothing is told so (None); the others keep overlapping their writes.
    # (The last epoch always saves: the end of fit's checkpoint.)
    events: list[tuple[str, Any]] = []

    class Reporter:
        def on_checkpoint_saved(self, trainer: DistributedTrainer, path: Path) -> None:
            events.append(("saved", path.name))

        def on_epoch_saved(self, trainer: Any, epoch: int, metrics: Any, path: Any) -> None:
            if path is not None:
                assert verify_file(path) and _pointer_step(tmp_path) == trainer.global_step
            events.append((f"epoch {epoch}", None if path is None else path.name))
            assert metrics["train_loss"] > 0

    def slow_pointer(point: str) -> None:
        if point == "before-pointer":
            time.sleep(0.3)

    fault_hook(slow_pointer)
    trainer = make_trainer(mlp(6, 8, 3), callbacks=[Reporter()])
    trainer.fit(
        *classification(64, 6, 3, seed=1), _config(tmp_path, epochs=3, checkpoint_every_n_epochs=2)
    )
    assert events == [
        ("epoch 0", None),
        ("saved", "ckpt-e000002-s000000016.pt"),
        ("epoch 1", "ckpt-e000002-s000000016.pt"),
        # the last epoch's save is the end of fit's: its report names the final checkpoint
        ("saved", "ckpt-e000003-s000000024.pt"),
        ("epoch 2", "ckpt-e000003-s000000024.pt"),
    ]


def test_an_exception_in_the_loop_still_lets_the_write_in_flight_land(tmp_path, fault_hook):
    def slow_pointer(point: str) -> None:
        if point == "before-pointer":
            time.sleep(0.5)

    def fail_after_the_save(trainer: DistributedTrainer, epoch: int, step: int, ids: Any) -> None:
        if step == 5:
            raise KeyboardInterrupt  # what a Ctrl-C in the loop raises

    fault_hook(slow_pointer)
    trainer = make_trainer(mlp(6, 8, 3))
    trainer.on_batch = fail_after_the_save
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(
            *classification(64, 6, 3, seed=1), _config(tmp_path, checkpoint_every_n_steps=4)
        )
    assert _pointer_step(tmp_path) == 4  # the save at step 4 was drained, not abandoned


def test_a_failed_background_write_is_raised_by_fit(tmp_path, fault_hook) -> None:
    def disk_full(point: str) -> None:
        if point == "before-manifest":
            raise OSError(28, "No space left on device")

    fault_hook(disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        make_trainer(mlp(6, 8, 3)).fit(
            *classification(64, 6, 3, seed=1), _config(tmp_path, checkpoint_every_n_steps=4)
        )


_SIGTERM_SCRIPT = """
import os, signal, sys, time
import torch
from rankwise.train import DistributedTrainer, DistributedTrainingConfig
from rankwise.train.checkpoint import set_fault_hook

def slow_pointer(point):
    if point == "before-pointer":
        time.sleep(1.0)

def stop_after_the_save(trainer, epoch, step, ids):
    if step == 5:  # the save at step 4 is being written: a scheduler preempts the job
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

set_fault_hook(slow_pointer)
torch.manual_seed(0)
model = torch.nn.Linear(6, 3)
trainer = DistributedTrainer(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1))
trainer.on_batch = stop_after_the_save
cfg = DistributedTrainingConfig(epochs=1, batch_size=8, verbose=False, checkpoint_dir=sys.argv[1],
                                checkpoint_every_n_steps=4)
trainer.fit(torch.randn(64, 6), torch.randint(0, 3, (64,)), cfg)
"""


def test_sigterm_waits_for_the_write_in_flight_then_ends_the_process(tmp_path) -> None:
    script = tmp_path / "preempted.py"
    script.write_text(textwrap.dedent(_SIGTERM_SCRIPT))
    folder = tmp_path / "ckpt"
    result = subprocess.run(
        [sys.executable, str(script), str(folder)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]  # still ends as before
    assert _pointer_step(folder) == 4  # but only once step 4's checkpoint was durable


def _two_ranks(folder: str, background: bool) -> dict[str, Any]:
    import rankwise.distributed as rd

    saved: list[str] = []

    class Saved:
        def on_checkpoint_saved(self, trainer: DistributedTrainer, path: Path) -> None:
            saved.append(Path(path).name)

    trainer = make_trainer(mlp(6, 8, 3), callbacks=[Saved()])
    cfg = _config(Path(folder), checkpoint_every_n_steps=2, async_checkpoints=background)
    trainer.fit(*classification(64, 6, 3, seed=1), cfg)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    return {"rank": rd.get_rank(), "saved": saved, "weights": weights}


def test_two_ranks_background_and_synchronous_saves_agree(tmp_path) -> None:
    background = run_distributed(_two_ranks, 2, args=(str(tmp_path / "bg"), True))
    synchronous = run_distributed(_two_ranks, 2, args=(str(tmp_path / "sync"), False))
    names = ["ckpt-e000000-s000000002.pt", "ckpt-e000001-s000000004.pt"]  # 4: epoch 1 starts
    for out in (*background, *synchronous):
        assert out["saved"] == names, out  # every rank is told, once each file is durable
    for a, b in zip(background, synchronous, strict=True):
        for key in a["weights"]:
            assert torch.equal(a["weights"][key], b["weights"][key]), key
    bg = torch.load(tmp_path / "bg" / names[-1], weights_only=True)
    sync = torch.load(tmp_path / "sync" / names[-1], weights_only=True)
    for key in sync["model"]:
        assert torch.equal(bg["model"][key], sync["model"][key]), key


def test_a_rank_that_never_writes_keeps_its_sigterm_handler(tmp_path) -> None:
    # A Python handler runs only once the main thread is back in Python: a rank blocked in a
    # collective would ignore a launcher's SIGTERM. Only a rank that may have a write in
    # flight installs one: under --on-failure continue (a callable), whoever writes now.
    from rankwise.train.checkpoint.writer import CheckpointWriter
    from rankwise.train.sigterm import guarded

    manager = CheckpointManager(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    for writes, installs in (
        (False, False),
        (True, True),
        (lambda: False, False),
        (lambda: True, True),
    ):
        writer = CheckpointWriter(
            manager, writes=writes, background=True, shared=True, saved=lambda path: None
        )
        with guarded([writer.sigterm_duty()]):
            assert (signal.getsignal(signal.SIGTERM) is not before) == installs, writes
        assert signal.getsignal(signal.SIGTERM) is before
