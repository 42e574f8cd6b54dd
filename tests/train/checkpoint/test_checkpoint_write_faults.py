"""Nothing lost, nothing held (issue 30): every failure of a checkpoint write, whatever the
writing library raises, stops ``fit`` with one :class:`CheckpointWriteError` naming the file and
the cause; a store that does not answer never holds the loop beyond the snapshot, and the end of
``fit`` waits for it a bounded time.

The fault class: the real writer (background and synchronous) over a real folder and a real
``memory://`` store, an exception of each kind a writing library raises (an ``OSError``, torch's
``RuntimeError`` over one, a bare ``RuntimeError``, a ``TimeoutError``, a library's own class)
injected at each point of a write (``set_fault_hook``), the error looked for where the docs say
it comes (at once for a synchronous save, the next save, or the end of ``fit``). A real full disk (a tmpfs) is in ``test_a_real_full_disk_...`` below and,
across 2 launched ranks, in tests/train/test_train_continue_failures.py."""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.disks import fill, tmpfs
from rankwise.train import DistributedTrainingConfig
from rankwise.train.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CheckpointWarning,
    RemoteCheckpointManager,
    RetryPolicy,
    Storage,
    set_fault_hook,
)
from rankwise.train.checkpoint import writer as writer_module
from rankwise.train.checkpoint.staging import BackgroundSaves
from rankwise.train.checkpoint.writer import CheckpointWriteError, CheckpointWriter


class ReadTimeoutError(Exception):
    """Named as botocore's: what a store's client raises when it goes unwrapped."""


def _torch_after_enospc() -> None:
    # what torch.save raises on a full disk: its zip writer's error, raised while the OSError
    # of the write is handled
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        raise RuntimeError(  # noqa: B904 (as torch raises it: its context, not its cause)
            "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
        )


def _raiser(exc: BaseException) -> Callable[[], None]:
    def raise_it() -> None:
        raise exc

    return raise_it


# name -> (what raises it, text the error quotes, the innermost text: what a store's error
# quotes, which says only the exception it caught)
FAULTS: dict[str, tuple[Callable[[], None], str, str]] = {
    "enospc": (
        _raiser(OSError(28, "No space left on device")),
        "[Errno 28] No space left",
        "No space left",
    ),
    "torch-after-enospc": (
        _torch_after_enospc,
        "[Errno 28] No space left on device (then RuntimeError: [enforce fail at inline_container",
        "unexpected pos 704",
    ),
    "runtime": (
        _raiser(RuntimeError("unexpected pos 704 vs 598")),
        "RuntimeError: unexpected pos",
        "unexpected pos",
    ),
    "timeout": (_raiser(TimeoutError("the disk did not answer")), "did not answer", "did not"),
    "library": (
        _raiser(ReadTimeoutError("Read timeout on endpoint")),
        "ReadTimeoutError: Read timeout",
        "Read timeout",
    ),
}
LOCAL_POINTS = ("mid-write", "before-rename", "before-manifest", "before-pointer", "before-prune")
REMOTE_POINTS = ("mid-write", "before-manifest", "mid-upload", "before-pointer", "before-prune")


class _State:
    epoch = 0

    def __init__(self, step: int) -> None:
        self.step = step

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]:
        return {"w": torch.full((256,), float(self.step)), "step": self.step}


@pytest.fixture
def hook() -> Iterator[Callable[[Callable[[str], None]], None]]:
    yield lambda fn: set_fault_hook(fn)
    set_fault_hook(None)


def _writer(manager: Any, background: bool, saved: list[Any], **wait: float) -> Any:
    return CheckpointWriter(
        manager, writes=True, background=background, shared=True, saved=saved.append, **wait
    )


def _settle(manager: Any) -> None:
    """Until every write handed to the background thread ended (not taking its result)."""
    while (pending := manager.pending()) is not None and not pending.done():
        pending.exception()
    deadline = time.monotonic() + 10
    while any(not f.done() for f in getattr(manager._background, "_writes", [])):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _strike(
    manager: Any, hook: Any, fault: str, point: str, when: str
) -> tuple[BaseException | None, list[str]]:
    """Save step 1, then step 2 with ``fault`` at ``point``; return what stopped the writer at
    ``when`` (the save of step 2 itself, synchronous; the next save; the end of fit) and the
    warnings given."""
    raise_it = FAULTS[fault][0]
    background = when != "at-once"
    writer = _writer(manager, background, [])
    writer.save(_State(1))
    if background:
        manager.wait()
    armed = [True]

    def strike(at: str) -> None:
        if at == point and armed[0]:
            armed[0] = False
            raise_it()

    hook(strike)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            writer.save(_State(2))
            _settle(manager)
            if when == "next-save":
                writer.save(_State(3))
            writer.finish(_State(3))
        except Exception as exc:
            return exc, [str(w.message) for w in caught]
    return None, [str(w.message) for w in caught]


@pytest.mark.parametrize("when", ["at-once", "next-save", "end-of-fit"])
@pytest.mark.parametrize("point", LOCAL_POINTS)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_any_failure_of_a_local_write_stops_with_one_error_naming_the_file(
    tmp_path: Path, hook: Any, fault: str, point: str, when: str
) -> None:
    manager = CheckpointManager(tmp_path)
    stopped, _ = _strike(manager, hook, fault, point, when)
    assert isinstance(stopped, CheckpointWriteError), repr(stopped)
    assert isinstance(stopped, OSError) and isinstance(stopped, CheckpointError)
    said = str(stopped)
    assert f"writing the checkpoint {manager.path_for(0, 2)} failed: " in said, said
    assert FAULTS[fault][1] in said, said
    assert "relaunch with resume='auto'" in said
    # the previous checkpoint is intact (past the pointer, the new one is the latest)
    assert manager.latest() == manager.path_for(0, 2 if point == "before-prune" else 1)
    assert not list(tmp_path.glob(".*tmp-*"))  # no temporary file left behind


@pytest.mark.parametrize("when", ["at-once", "next-save", "end-of-fit"])
@pytest.mark.parametrize("point", REMOTE_POINTS)
@pytest.mark.parametrize("fault", ["enospc", "torch-after-enospc", "library"])
def test_any_failure_of_an_upload_stops_or_warns_naming_the_url(
    hook: Any, fault: str, point: str, when: str
) -> None:
    store = Storage.for_url(
        f"memory://rankwise-faults-{uuid.uuid4().hex[:8]}/run", retry=RetryPolicy(attempts=1)
    )
    manager = RemoteCheckpointManager(store)
    stopped, said = _strike(manager, hook, fault, point, when)
    url = manager.path_for(0, 2)
    lost = [m for m in said if f"the checkpoint {url} was not saved" in m]
    if point == "mid-upload" and when == "next-save":
        # the store's own call failed: a lost checkpoint is a warning mid-fit, and the next
        # save goes on (it lands)
        assert stopped is None, repr(stopped)
        assert len(lost) == 1 and FAULTS[fault][2] in lost[0], said
        assert manager.latest() == manager.path_for(0, 3)
        return
    assert isinstance(stopped, CheckpointWriteError), repr(stopped)
    text = str(stopped)
    assert url in text, text
    inner = point == "mid-upload"  # the store's error, which quotes what it caught
    assert FAULTS[fault][2 if inner else 1] in text, text
    if inner and when == "end-of-fit":
        assert "could not be made durable" in text  # the end of fit insists
    assert not lost, said
    assert manager.latest() == manager.path_for(0, 2 if point == "before-prune" else 1)


# -- a store that does not answer -----------------------------------------------------------------


@pytest.fixture
def held(hook: Any) -> Iterator[threading.Event]:
    """A ``memory://`` store whose next write hangs before its pointer until the event is set
    (a store that took the data and does not answer)."""
    release = threading.Event()
    hanging = [True]

    def hang(point: str) -> None:
        if point == "before-pointer" and hanging[0]:
            hanging[0] = False
            release.wait(30)

    hook(hang)
    try:
        yield release
    finally:
        release.set()


def test_a_silent_store_never_holds_the_loop_and_the_newest_state_wins(
    held: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "SILENT_S", 0.0)  # announced at once
    manager = RemoteCheckpointManager(
        Storage.for_url(f"memory://rankwise-silent-{uuid.uuid4().hex[:8]}/run")
    )
    saved: list[Any] = []
    writer = _writer(manager, True, saved)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer.save(_State(1))  # hangs in the background
        blocked = []
        for step in (2, 3, 4):
            started = time.monotonic()
            writer.save(_State(step))  # queued behind it, each replacing the last
            blocked.append(time.monotonic() - started)
        assert max(blocked) < 2.0, blocked  # the snapshot only (before: until it answered)
        said = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
        assert len(said) == 1, said  # once per outage
        assert f"the checkpoint store {manager.directory} has not answered for " in said[0]
        assert f"(the write of {manager.path_for(0, 1)} still runs)" in said[0]
        held.set()
        writer.finish(_State(4))
    # step 1 and the newest (4) landed; 2 and 3 were replaced before they started
    assert saved == [manager.path_for(0, 1), manager.path_for(0, 4)]
    assert manager.latest() == manager.path_for(0, 4)
    assert manager.checkpoints() == [manager.path_for(0, s).rsplit("/", 1)[1] for s in (1, 4)]
    assert writer.stats.waits == 1  # the end of fit only


def test_the_end_of_fit_waits_a_bounded_time_for_a_silent_store(held: Any) -> None:
    manager = RemoteCheckpointManager(
        Storage.for_url(f"memory://rankwise-silent-{uuid.uuid4().hex[:8]}/run")
    )
    writer = _writer(manager, True, [], final_wait_s=0.5)
    writer.save(_State(1))
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(CheckpointWriteError) as stopped:
            writer.finish(_State(1))
    assert 0.5 <= time.monotonic() - started < 15  # a silent store never answers: bounded
    said = str(stopped.value)
    assert f"fit's last checkpoint ({manager.path_for(0, 1)}) was not durable within " in said
    assert "checkpoint_final_wait_s=0.5 s" in said and manager.directory in said


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "600"])
def test_the_final_wait_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"checkpoint_final_wait_s \(.*\) must be a finite"):
        DistributedTrainingConfig(checkpoint_final_wait_s=bad)
    assert DistributedTrainingConfig(checkpoint_final_wait_s=5).checkpoint_final_wait_s == 5.0


def test_s3_reads_and_connections_time_out_and_the_users_options_win() -> None:
    pytest.importorskip("s3fs")
    fs = Storage.for_url("s3://bucket/run").fs
    assert fs.config_kwargs["connect_timeout"] == 5 and fs.config_kwargs["read_timeout"] == 30
    own = {"config_kwargs": {"read_timeout": 2, "retries": {"max_attempts": 3}}}
    fs = Storage.for_url("s3://bucket/run", own).fs
    assert fs.config_kwargs["read_timeout"] == 2 and fs.config_kwargs["connect_timeout"] == 5
    assert fs.config_kwargs["retries"] == {"max_attempts": 3}


# -- a real full disk ---------------------------------------------------------------------------


@pytest.mark.parametrize("background", [True, False])
def test_a_real_full_disk_stops_with_one_error_naming_the_file(
    tmp_path: Path, background: bool
) -> None:
    with tmpfs(tmp_path / "disk", "4m") as disk:
        manager = CheckpointManager(disk / "ckpt")
        writer = _writer(manager, background, [])
        writer.check_folder()
        fill(disk, 64 << 10)  # the probe passed; a checkpoint of 1 MiB does not fit
        big = _State(2)
        big.state_dict = lambda sharded=False: {"w": torch.zeros(1 << 18)}  # type: ignore
        with pytest.raises(CheckpointWriteError) as stopped:
            writer.save(big)
            writer.finish(big)
        said = str(stopped.value)
        assert said.startswith(f"writing the checkpoint {manager.path_for(0, 2)} failed: ")
        assert "[Errno 28] No space left on device" in said, said
        assert not list((disk / "ckpt").glob(".*tmp-*"))


def test_queued_snapshots_reuse_two_buffers_at_most() -> None:
    # The newest state wins without a snapshot's memory per save: one buffer while writes end
    # before the next save, two while one is held (the one written, the newest queued).
    saves: BackgroundSaves[int] = BackgroundSaves()
    seen: set[int | None] = set()
    for step in range(20):
        saves.submit(lambda snap: id(snap["w"]), {"w": torch.full((4,), float(step))})
        seen.add(saves.wait())
    assert len(seen) == 1, seen
    release = threading.Event()
    held = saves.submit(lambda snap: release.wait(10) and id(snap["w"]), {"w": torch.zeros(4)})
    queued = [
        saves.submit(lambda snap: id(snap["w"]), {"w": torch.full((4,), float(s))}, behind=True)
        for s in range(20)
    ]
    assert all(f.cancelled() for f in queued[:-1]) and not queued[-1].cancelled()
    release.set()
    seen |= {held.result(10), queued[-1].result(10)}
    saves.wait()
    assert len(seen) == 2 and len(saves._free) <= 2, seen
