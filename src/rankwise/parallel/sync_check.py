"""Detect parameters (and optionally gradients / optimizer state) that diverged across ranks.

The CyxWiz guide's "Gradients differ across ranks" warning has three usual causes: ranks that
started from different weights (``broadcast_parameters=False``), different random seeds, or a
different architecture. :func:`check_parameters_in_sync` finds which tensors differ, and on
which ranks, for the price of three float64 numbers per tensor and two small all-gathers.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator

import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.parallel.common import unwrap_model
from rankwise.parallel.fsdp import as_dtensor


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One tensor that is not the same everywhere: ``groups`` lists ranks that agree."""

    name: str
    groups: tuple[tuple[int, ...], ...]
    max_difference: float

    def __str__(self) -> str:
        detail = f"(checksums differ by up to {self.max_difference:.3g})"
        if len(self.groups) == 2:
            ref, odd = self.groups
            verb = "differs" if len(odd) == 1 else "differ"
            return f"{self.name}: {_ranks(odd)} {verb} from {_ranks(ref)} {detail}"
        split = " | ".join(str(list(g)) for g in self.groups)
        return f"{self.name}: ranks disagree in {len(self.groups)} groups {split} {detail}"


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """Truthy when every checked tensor agrees on all ranks; ``str()`` says what differs.

    >>> bool(SyncReport(world_size=2, checked=4))
    True
    >>> print(SyncReport(2, 4, (Mismatch("fc.weight", ((0,), (1,)), 0.5),)))
    1 of 4 tensors differ across 2 ranks:
      fc.weight: rank 1 differs from rank 0 (checksums differ by up to 0.5)
    """

    world_size: int
    checked: int
    mismatches: tuple[Mismatch, ...] = ()
    structure_error: str | None = None
    skipped: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return not self.mismatches and self.structure_error is None

    def __str__(self) -> str:
        if self.structure_error is not None:
            return f"ranks hold different models: {self.structure_error}"
        if not self.mismatches:
            return f"all {self.checked} tensors are in sync across {self.world_size} ranks"
        lines = [
            f"{len(self.mismatches)} of {self.checked} tensors differ across "
            f"{self.world_size} ranks:"
        ]
        return "\n".join(lines + [f"  {m}" for m in self.mismatches])

    @property
    def names(self) -> list[str]:
        """Names of the tensors that differ."""
        return [m.name for m in self.mismatches]


def check_parameters_in_sync(
    model: nn.Module,
    atol: float = 0.0,
    *,
    buffers: bool = True,
    gradients: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
) -> SyncReport:
    """Compare every parameter (and buffer) of ``model`` across ranks, cheaply.

    Each tensor is summarised by its mean, root mean square and a position-weighted mean, in
    float64; the summaries are all-gathered and compared with tolerance ``atol``. If every
    element of two copies is within ``atol``, so is each summary, so an ``atol`` that covers
    expected noise never reports a false mismatch; with the default 0.0 any difference in a
    summary counts. ``gradients`` also checks ``.grad`` (equal on all ranks after a DDP sync
    step); ``optimizer`` adds its per-parameter state (momentum, Adam moments, step).

    Sharded FSDP2 parameters (``DTensor`` on ``Shard``) hold different data on each rank by
    design and are skipped (listed in ``report.skipped``). A world of one is always in sync.
    Every rank must call this (it is a collective).

    >>> report = check_parameters_in_sync(nn.Linear(2, 2))   # world of one
    >>> bool(report), report.checked
    (True, 2)
    """
    if atol < 0:
        raise ValueError(f"atol ({atol}) must be >= 0 (0.0 demands bit-identical summaries).")
    named, skipped = _collect(unwrap_model(model), buffers, gradients, optimizer)
    world = rd.get_world_size()
    if world == 1 or not rd.has_group():
        return SyncReport(world_size=1, checked=len(named), skipped=tuple(skipped))
    device = rd.device()
    # Agree on the structure first: all_gather needs equal sizes on every rank, and mixing up
    # tensors of different models would give a meaningless report.
    error = structure_mismatch(named, world, device)
    if error is not None:
        return SyncReport(world, 0, structure_error=error, skipped=tuple(skipped))
    if not named:
        return SyncReport(world_size=world, checked=0, skipped=tuple(skipped))
    local = torch.stack([_summary(t).to(device) for _, t in named])
    gathered = torch.stack(rd.all_gather([torch.empty_like(local) for _ in range(world)], local))
    gathered = gathered.cpu()  # [world, tensors, 3]
    mismatches = [
        m
        for i, (name, _) in enumerate(named)
        if (m := _compare(name, gathered[:, i, :], atol)) is not None
    ]
    return SyncReport(world, len(named), tuple(mismatches), None, tuple(skipped))


def structure_mismatch(
    named: list[tuple[str, torch.Tensor]], world: int, device: torch.device
) -> str | None:
    signature = zlib.crc32("\n".join(f"{n}:{tuple(t.shape)}" for n, t in named).encode())
    header = torch.tensor([len(named), signature], dtype=torch.float64, device=device)
    headers = rd.all_gather([torch.empty_like(header) for _ in range(world)], header)
    keys = [(int(h[0].item()), int(h[1].item())) for h in headers]
    if len(set(keys)) == 1:
        return None
    groups: dict[tuple[int, int], list[int]] = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    odd = ", ".join(_ranks(tuple(g)) for g in ordered[1:])
    counts = ", ".join(str(k[0]) for k in keys)
    return (
        f"the names or shapes of the tensors on {odd} differ from those on "
        f"{_ranks(tuple(ordered[0]))} (tensors per rank: {counts}); build the same model on "
        "every rank."
    )


def _collect(
    model: nn.Module,
    buffers: bool,
    gradients: bool,
    optimizer: torch.optim.Optimizer | None,
) -> tuple[list[tuple[str, torch.Tensor]], list[str]]:
    named: list[tuple[str, torch.Tensor]] = []
    skipped: list[str] = []

    def add(name: str, tensor: torch.Tensor) -> None:
        local = _local(tensor)
        if local is None:
            skipped.append(name)
        else:
            named.append((name, local))

    params = list(model.named_parameters())
    for name, param in params:
        add(name, param.detach())
    if buffers:
        for name, buf in model.named_buffers():
            add(f"buffer {name}", buf)
    if gradients:
        for name, param in params:
            if param.grad is not None:
                add(f"grad {name}", param.grad)
    if optimizer is not None:
        for name, key, value in _optimizer_tensors(optimizer, params):
            add(f"optimizer {name}.{key}", value)
    return named, skipped


def _optimizer_tensors(
    optimizer: torch.optim.Optimizer, params: list[tuple[str, nn.Parameter]]
) -> Iterator[tuple[str, str, torch.Tensor]]:
    names = {id(p): n for n, p in params}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    yield names.get(id(p), f"<param {id(p):#x}>"), key, value


def _local(tensor: torch.Tensor) -> torch.Tensor | None:
    dtensor = as_dtensor(tensor)
    if dtensor is None:
        return tensor
    if all(p.is_replicate() for p in dtensor.placements):
        return dtensor.to_local()
    return None  # sharded: each rank holds a different piece by design


def _summary(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1).to(torch.float64)
    if flat.numel() == 0:
        return torch.zeros(3, dtype=torch.float64, device=flat.device)
    # Weights in [1, 2] make the third number depend on positions: swapped entries show up.
    weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
    return torch.stack(
        [
            flat.mean(),
            flat.square().mean().sqrt(),
            (flat * weights).sum() / weights.sum(),
        ]
    )


def _compare(name: str, rows: torch.Tensor, atol: float) -> Mismatch | None:
    """Group ranks whose summaries agree; ``rows`` is [world, 3]."""
    groups: list[list[int]] = []
    for rank in range(rows.shape[0]):
        for group in groups:
            if _close(rows[group[0]], rows[rank], atol):
                group.append(rank)
                break
        else:
            groups.append([rank])
    if len(groups) == 1:
        return None
    # The largest group is the reference (rank 0's on a tie): it names the odd ones out.
    groups.sort(key=lambda g: (-len(g), g[0]))
    diff = float((rows - rows[groups[0][0]]).abs().nan_to_num(float("inf")).max())
    return Mismatch(name, tuple(tuple(g) for g in groups), diff)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    # A NaN on every rank is the same NaN everywhere: in sync (if broken) rather than diverged.
    close = (a == b) | ((a - b).abs() <= atol)
    return bool((close | (a.isnan() & b.isnan())).all())


def _ranks(group: tuple[int, ...]) -> str:
    return f"rank {group[0]}" if len(group) == 1 else f"ranks {list(group)}"
