"""The training state: where a run is, as one object to snapshot, write, read back and send.

:class:`TrainState` holds the live objects a step changes (the wrapped model, the optimizer,
the scheduler, the precision plug-in with its GradScaler, the sampler with its resume cursor)
and the counters around them (epoch, optimizer step, the epoch's running sums, the history,
whether the learning rate was scaled). ``state_dict()`` turns it into plain values whose model
and optimizer keys do not depend on the wrapping; ``load_state_dict()`` puts them back, on any
world size. What is done with those values is a function over them:

- :mod:`rankwise.train.checkpoint`: a copy in reusable CPU buffers for a writer that works
  while training goes on, atomic verified files, and picking the newest valid one up again;
- :func:`broadcast_state`: one rank's state dict on every rank, over the process group.

``state_dict()`` (checkpoint format 1)::

    format, model, optimizer, scheduler, precision, sampler (the cursor), epoch (the one to
    run next: the current one mid-epoch), step, rng (rank 0's), config, world_size,
    global_batch_size, history, trainer: {epoch_sums (the world's, so far), lr_scaled,
    comm (a compression hook's state), rng_per_rank, trackers (tracker name: run id)}

>>> net = torch.nn.Linear(2, 1)
>>> state = TrainState(net, torch.optim.SGD(net.parameters(), lr=0.1))
>>> saved = state.state_dict()
>>> saved["step"], sorted(saved["model"])
(0, ['bias', 'weight'])
>>> TrainState(torch.nn.Linear(2, 1)).load_state_dict(saved)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import rankwise.distributed as rd
from rankwise.distributed.errors import RankwiseWarning
from rankwise.parallel import Precision, comm_state_dict, load_comm_state_dict
from rankwise.train.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    load_model_state_dict,
    load_optimizer_state_dict,
    load_shards,
    model_state_dict,
    optimizer_state_dict,
    rng_state,
    set_rng_state,
    sharded_state_dicts,
)
from rankwise.train.config import DistributedTrainingConfig
from rankwise.train.sums import EpochSums
from rankwise.train.tracking.history import DistributedTrainingHistory

__all__ = ["Restored", "TrainState", "broadcast_state"]

_NO_SUMS = [0.0, 0.0, 0.0, 0.0]


@dataclass
class Restored:
    """What a load left for the objects that did not exist yet (the data, the precision)."""

    global_batch: int  # the saved run's; checked against each fit's config
    mid_epoch: bool  # saved inside an epoch: only a saved sampler cursor continues it
    cursor: dict[str, Any] | None = None  # the sampler's saved state
    precision: dict[str, Any] | None = None  # for a Precision built after the load


@dataclass(eq=False)
class TrainState:
    """Everything a resume needs, and nothing else.

    ``epoch`` is the epoch running (or, between epochs, the next one); ``sums`` the running
    metric sums of the epoch in progress (None between epochs); ``step`` counts optimizer
    steps. ``optimizer`` and ``precision`` are None until the trainer has built them.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    precision: Precision | None = None
    sampler: Any = None  # a resumable sampler (state_dict / load_state_dict), or None
    config: DistributedTrainingConfig | None = None
    epoch: int = 0
    step: int = 0
    sums: EpochSums | None = None
    history: DistributedTrainingHistory = field(default_factory=DistributedTrainingHistory)
    lr_scaled: bool = False
    restored: Restored | None = None
    # The experiment trackers' run ids ({"wandb": "1x2y3z"}): a resumed or continued job
    # logs into the same runs (rankwise.train.tracking). On every rank, in every checkpoint.
    trackers: dict[str, str] = field(default_factory=dict)

    def hold_prepared(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        precision: Precision,
    ) -> None:
        """Take the objects the first ``fit`` built (the wrapped model, the optimizer over its
        parameters); a precision state loaded before them is applied now."""
        self.model, self.optimizer, self.scheduler, self.precision = (
            model,
            optimizer,
            scheduler,
            precision,
        )
        if self.restored is not None and self.restored.precision is not None:
            precision.load_state_dict(self.restored.precision)
            self.restored.precision = None

    def start_over(self) -> None:
        """A fresh run: epoch 0, no optimizer step, no sums, an empty history."""
        self.epoch, self.step, self.sums = 0, 0, None
        self.history = DistributedTrainingHistory()
        self.restored = None
        self.trackers = {}  # a new run for each tracker

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]:
        """The state as plain values (tensors on the CPU, numbers, strings, lists, dicts).

        A collective: the epoch's sums are all-reduced, every rank's RNG state gathered, and
        a sharded (FSDP2) model gathered to rank 0. Call it on every rank at a step boundary.
        ``sharded``: the model and optimizer state stay as each rank holds them (FSDP2's
        DTensor shards, nothing gathered), for a DCP folder (a sharded checkpoint).
        """
        if self.optimizer is None:
            raise ValueError("the training state has no optimizer yet: call fit() first.")
        world = rd.get_world_size()
        carried = self.sums.reduced().tolist() if self.sums is not None else list(_NO_SUMS)
        rngs: list[Any] = [rng_state()]
        if world > 1 and rd.has_group():
            rngs = rd.all_gather_plain(rngs[0])  # tensors and plain values: no peer's pickle
        cfg = self.config or DistributedTrainingConfig()
        precision = self.precision.state_dict() if self.precision is not None else None
        if precision is None and self.restored is not None:
            precision = self.restored.precision
        if sharded:
            model, optimizer = sharded_state_dicts(self.model, self.optimizer)
        else:
            model = model_state_dict(self.model)
            optimizer = optimizer_state_dict(self.model, self.optimizer)
        return {
            "format": FORMAT_VERSION,
            "model": model,
            "optimizer": optimizer,
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "precision": precision,
            "sampler": self._cursor(),
            "epoch": self.epoch,
            "step": self.step,
            "rng": rngs[0],
            "config": cfg.to_dict(),
            "world_size": world,
            "global_batch_size": cfg.effective_batch_size(world),
            "history": self.history.to_dict(),
            "trainer": {
                "epoch_sums": carried,
                "lr_scaled": self.lr_scaled,
                "comm": comm_state_dict(self.model),
                "rng_per_rank": rngs,
                "trackers": dict(self.trackers),
            },
        }

    def load_state_dict(self, state: dict[str, Any], source: object = "the state") -> None:
        """Put ``state`` (a :meth:`state_dict`, possibly from another world size) back.

        A collective. Model, optimizer, scheduler, precision and RNG are loaded into the
        objects that exist; an optimizer or precision built later (a factory, the first
        ``fit``) starts fresh or takes :attr:`restored`'s values. The sampler's cursor waits
        in :attr:`restored` for the data (:meth:`resume_data`).
        ``source`` names the state in errors (a file's path).
        """
        version = state.get("format")
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{source}: checkpoint format {version!r} is not {FORMAT_VERSION}; it was "
                "written by another rankwise version or is not a trainer checkpoint. Load it "
                "with the rankwise version that wrote it, pass a checkpoint this trainer "
                "saved, or start fresh with resume=None."
            )
        # Before the first fit() an optimizer given as a factory does not exist yet: the next
        # fit builds it fresh (the model weights are what a loaded checkpoint is mostly for).
        if "dcp" in state:  # a sharded checkpoint: the tensors are in its folder's shards
            load_shards(self.model, self.optimizer, state)
        else:
            load_model_state_dict(self.model, state["model"])
            if self.optimizer is not None:
                load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.precision is not None:
            self.precision.load_state_dict(state["precision"])
        extra = state.get("trainer", {})
        if extra.get("comm"):
            load_comm_state_dict(self.model, extra["comm"])
        self.lr_scaled = bool(extra.get("lr_scaled", False))
        self.trackers = {str(k): str(v) for k, v in (extra.get("trackers") or {}).items()}
        rngs = extra.get("rng_per_rank") or [state["rng"]]
        # Each rank continues its own random stream when the world is the same; otherwise every
        # rank takes rank 0's (there is no right answer for a rank that did not exist).
        same_world = len(rngs) == rd.get_world_size()
        set_rng_state(rngs[rd.get_rank()] if same_world else state["rng"])
        # The world's sums of the epoch so far: the same on every rank, in the file; rank 0
        # alone carries them, so the epoch's all-reduce adds them once.
        carried = extra.get("epoch_sums") or list(_NO_SUMS)
        mid_epoch = float(carried[1]) > 0
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.history = DistributedTrainingHistory.from_dict(state["history"])
        self.sums = None
        if mid_epoch:
            self.sums = EpochSums(carried=list(carried) if rd.is_master() else list(_NO_SUMS))
        self.restored = Restored(
            global_batch=int(state["global_batch_size"]),
            mid_epoch=mid_epoch,
            cursor=state.get("sampler"),
            precision=None if self.precision is not None else state["precision"],
        )

    def resume_data(self, cfg: DistributedTrainingConfig) -> None:
        """Check that the restored state can go on under ``cfg`` on this world, then move the
        sampler to where the run stopped (the rest of the epoch re-split over this world size).

        Runs for a resume and after ``load_checkpoint()`` before ``fit()`` alike; nothing to do
        when nothing was restored.
        """
        restored = self.restored
        if restored is None:
            return
        _check_global_batch(
            restored.global_batch, cfg.batch_size, rd.get_world_size(), cfg.grad_accum_steps
        )
        self._check_resumable(restored)
        saved = restored.cursor
        if self.sampler is not None and saved is not None and saved["epoch"] == self.epoch:
            self.sampler.load_state_dict(saved)

    def _check_resumable(self, restored: Restored) -> None:
        """Refuse a mid-epoch resume that cannot continue where the run stopped: without a
        saved rankwise sampler cursor the loader would repeat the epoch from its start (its
        first part trained, and counted, twice)."""
        sampler = self.sampler
        if not restored.mid_epoch or (sampler is not None and restored.cursor is not None):
            return
        missing = "this run's" if sampler is None else "the checkpoint's"
        raise ValueError(
            f"cannot resume mid-epoch (epoch {self.epoch}, optimizer step {self.step}): "
            f"{missing} training data has no rankwise DistributedSampler, so the rest of the "
            "epoch is unknown and the loader would repeat it from the start. Put "
            "rankwise.data.DistributedSampler in your DataLoader (or pass the Dataset and let "
            "the trainer build the loader), or resume from an epoch-end checkpoint "
            "(checkpoint_every_n_steps=0)."
        )

    def _cursor(self) -> dict[str, Any] | None:
        if self.sampler is not None:
            return dict(self.sampler.state_dict())
        return None if self.restored is None else self.restored.cursor


def _check_global_batch(saved: int, batch_size: int, world: int, accum: int) -> None:
    """Refuse a resume whose saved global batch this world cannot reproduce; warn when the
    user changed it (the run then differs from an uninterrupted one)."""
    now = batch_size * world * accum
    if saved == now:
        return
    if saved % (world * accum):
        raise ValueError(
            f"saved global batch {saved} cannot be split over {world} ranks x {accum} "
            f"accumulation steps; use batch_size such that batch_size x world_size x "
            f"grad_accum_steps = {saved} (a world size and grad_accum_steps whose product "
            f"divides {saved}), or start a fresh run with resume=None."
        )
    warnings.warn(
        f"the checkpoint was saved with global batch {saved} and this run's is {now} "
        f"(batch_size {batch_size} x {world} ranks x {accum}); training goes on with {now}. "
        f"Set batch_size={saved // (world * accum)} to continue exactly as the saved run.",
        RankwiseWarning,
        stacklevel=4,
    )


def broadcast_state(
    state: dict[str, Any] | None, src: int = 0, group: dist.ProcessGroup | None = None
) -> dict[str, Any]:
    """Rank ``src``'s ``state`` (any nest of dicts, lists and tuples over tensors and plain
    values) on every rank of ``group``; the others pass None. A collective.

    The structure travels with each tensor replaced by its shape and dtype, as ``torch.save``
    bytes read back with ``weights_only=True`` (a peer sends data, never code); the tensors'
    bytes travel as one flat buffer (one broadcast on the collective device, whatever the
    number of tensors). Received tensors are on the CPU.
    """
    if not rd.has_group() or dist.get_world_size(group) == 1:
        if state is None:
            raise ValueError("broadcast_state in a world of one needs the state, got None.")
        return state
    tensors: list[torch.Tensor] = []
    mine = _skeleton(state, tensors) if dist.get_rank() == src else None
    skeleton, sizes = rd.broadcast_plain(mine, src=src, group=group)
    device = rd.collective_device()
    if dist.get_rank() == src:
        flat = torch.cat([_bytes(t) for t in tensors]) if tensors else torch.empty(0)
        flat = flat.to(device, dtype=torch.uint8)
    else:
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    if sizes:
        dist.broadcast(flat, src=src, group=group)
    parts = iter(torch.split(flat.cpu(), sizes)) if sizes else iter(())
    return _fill(skeleton, parts)


_SLOT = "__rankwise_tensor__"  # a tensor's place in the skeleton: {_SLOT: [shape, dtype]}


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)


def _skeleton(state: Any, tensors: list[torch.Tensor]) -> tuple[Any, list[int]]:
    sizes: list[int] = []

    def strip(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            sizes.append(value.numel() * value.element_size())
            return {_SLOT: [list(value.shape), str(value.dtype).removeprefix("torch.")]}
        if isinstance(value, dict):
            return type(value)((k, strip(v)) for k, v in value.items())
        if type(value) in (list, tuple):
            return type(value)(strip(v) for v in value)
        return value

    return strip(state), sizes


def _fill(skeleton: Any, parts: Any) -> Any:
    if isinstance(skeleton, dict) and set(skeleton) == {_SLOT}:
        shape, dtype = skeleton[_SLOT]
        raw = next(parts).clone()
        return raw.view(getattr(torch, dtype)).reshape(shape)
    if isinstance(skeleton, dict):
        return type(skeleton)((k, _fill(v, parts)) for k, v in skeleton.items())
    if type(skeleton) in (list, tuple):
        return type(skeleton)(_fill(v, parts) for v in skeleton)
    return skeleton
