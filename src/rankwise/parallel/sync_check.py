"""Detect parameters (and optionally buffers, gradients, optimizer state) that diverged across ranks.

The CyxWiz guide's "Gradients differ across ranks" warning has three usual causes: ranks that
started from different weights (``broadcast_parameters=False``), different random seeds, or a
different architecture. :func:`check_parameters_in_sync` finds which tensors differ, and on
which ranks, for the price of four float64 numbers per tensor and two small all-gathers.

What "should agree" depends on how a tensor is laid out. A plain tensor (DDP, one process per
replica) must be equal on every rank. A ``DTensor`` (FSDP2, HSDP) must be equal on the ranks
that hold the *same piece*: the ranks that differ only in the mesh dimensions where its
placement is ``Replicate()``. Under plain FSDP2 (``(Shard(0),)`` on a 1-D mesh) every element
lives on exactly one rank, so there is no second copy to compare values with; all ranks still
compare the tensor's layout (global shape, dtype, placements), and the report says so.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

import rankwise.distributed as rd
from rankwise.parallel.common import unwrap_model
from rankwise.parallel.fsdp import as_dtensor

if TYPE_CHECKING:
    from torch.distributed.tensor import Placement


class OutOfSyncError(RuntimeError):
    """Parameters that must be equal on every rank are not; raised on every rank alike."""


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One tensor that is not the same everywhere: ``groups`` lists ranks that agree.

    ``what`` is ``"value"`` (the checksums differ) or ``"layout"`` (dtype or sharding differ).
    """

    name: str
    groups: tuple[tuple[int, ...], ...]
    max_difference: float
    what: str = "value"

    def __str__(self) -> str:
        if self.what == "layout":
            detail = "(dtype or sharding placements differ)"
        else:
            detail = f"(checksums differ by up to {self.max_difference:.3g})"
        if len(self.groups) == 2:
            ref, odd = self.groups
            verb = "differs" if len(odd) == 1 else "differ"
            return f"{self.name}: {_ranks(odd)} {verb} from {_ranks(ref)} {detail}"
        split = " | ".join(str(list(g)) for g in self.groups)
        return f"{self.name}: ranks disagree in {len(self.groups)} groups {split} {detail}"


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """Truthy when every compared tensor agrees on all ranks; ``str()`` says what differs.

    ``checked`` counts the tensors compared (never 0: comparing nothing is an error).
    ``unreplicated`` names those whose every element lives on one rank only (plain FSDP2
    shards): their layout was compared, their values cannot be (:attr:`by_value` counts the rest).

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
    unreplicated: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return not self.mismatches and self.structure_error is None

    def __str__(self) -> str:
        if self.structure_error is not None:
            return f"ranks hold different models: {self.structure_error}"
        if not self.mismatches:
            text = f"all {self.checked} tensors are in sync across {self.world_size} ranks"
            if self.unreplicated:
                text += (
                    f" ({self.by_value} compared by value; {len(self.unreplicated)} sharded with "
                    "no replica, so only their layout was compared)"
                )
            return text
        lines = [
            f"{len(self.mismatches)} of {self.checked} tensors differ across "
            f"{self.world_size} ranks:"
        ]
        return "\n".join(lines + [f"  {m}" for m in self.mismatches])

    @property
    def names(self) -> list[str]:
        """Names of the tensors that differ."""
        return [m.name for m in self.mismatches]

    @property
    def by_value(self) -> int:
        """How many tensors had their values compared (at least two ranks hold a copy)."""
        return self.checked - len(self.unreplicated)


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One tensor to compare: this rank's data, and who else should hold the same."""

    name: str
    tensor: torch.Tensor  # as the model holds it (a DTensor's shape is the global shape)
    local: torch.Tensor  # this rank's data
    layout: str  # what every rank must agree on besides names and shapes
    replicas: tuple[tuple[int, ...], ...] | None  # None: every rank holds the whole tensor


def check_parameters_in_sync(
    model: nn.Module,
    atol: float = 0.0,
    *,
    buffers: bool = False,
    gradients: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
) -> SyncReport:
    """Compare every parameter of ``model`` across ranks, cheaply.

    Each tensor is summarised by its mean, root mean square and a position-weighted mean, in
    float64; the summaries are all-gathered and compared with tolerance ``atol``. If every
    element of two copies is within ``atol``, so is each summary, so an ``atol`` that covers
    expected noise never reports a false mismatch; with the default 0.0 any difference in a
    summary counts. ``buffers`` also checks buffers (off by default: DDP lets BatchNorm
    running statistics differ between broadcasts, and with ``broadcast_buffers=False`` for
    good). ``gradients`` also checks ``.grad`` (equal on all ranks after a DDP sync step);
    ``optimizer`` adds its per-parameter state (momentum, Adam moments, step).

    FSDP2 / HSDP ``DTensor`` s are compared between the ranks that hold the same shard (see
    the module docstring). A model with nothing to compare raises ``ValueError`` rather than
    report "in sync". Every rank must call this (it is a collective).

    >>> report = check_parameters_in_sync(nn.Linear(2, 2))   # world of one
    >>> bool(report), report.checked
    (True, 2)
    """
    if atol < 0:
        raise ValueError(f"atol ({atol}) must be >= 0 (0.0 demands bit-identical summaries).")
    inner = unwrap_model(model)
    world = rd.get_world_size() if rd.has_group() else 1
    entries = _collect(inner, buffers, gradients, optimizer, world)
    if world == 1:
        _refuse_empty(entries, inner, buffers)
        return SyncReport(world_size=1, checked=len(entries))
    device = rd.device()
    # Agree on the structure first: all_gather needs equal sizes on every rank, and mixing up
    # tensors of different models would give a meaningless report.
    error = structure_mismatch([(e.name, e.tensor) for e in entries], world, device)
    if error is not None:
        return SyncReport(world, 0, structure_error=error)
    _refuse_empty(entries, inner, buffers)  # every rank got here with 0 tensors: all raise
    local = torch.stack([_summary(e).to(device) for e in entries])
    gathered = torch.stack(rd.all_gather([torch.empty_like(local) for _ in range(world)], local))
    gathered = gathered.cpu()  # [world, tensors, 4]: layout digest, then three checksums
    mismatches: list[Mismatch] = []
    unreplicated: list[str] = []
    for i, entry in enumerate(entries):
        found, compared = _compare_entry(entry, gathered[:, i, :], atol, world)
        mismatches.extend(found)
        if not compared:
            unreplicated.append(entry.name)
    return SyncReport(world, len(entries), tuple(mismatches), None, tuple(unreplicated))


def structure_mismatch(
    named: Sequence[tuple[str, torch.Tensor]], world: int, device: torch.device
) -> str | None:
    """``None`` if every rank holds the same tensor names and (global) shapes, else what differs."""
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


def _refuse_empty(entries: list[_Entry], model: nn.Module, buffers: bool) -> None:
    if entries:
        return
    n_buffers = sum(1 for _ in model.buffers())
    hint = (
        f" and {n_buffers} buffers (pass buffers=True to compare them)"
        if not buffers and n_buffers
        else ""
    )
    raise ValueError(
        f"check_parameters_in_sync found nothing to compare in {type(model).__name__}: it has "
        f"0 parameters{hint}. Pass the model you train (after wrapping), not an empty module; "
        "a check of nothing would report 'in sync' and prove nothing."
    )


def _collect(
    model: nn.Module,
    buffers: bool,
    gradients: bool,
    optimizer: torch.optim.Optimizer | None,
    world: int,
) -> list[_Entry]:
    entries: list[_Entry] = []
    sets: dict[tuple[int, str], tuple[tuple[int, ...], ...]] = {}  # one walk of each mesh

    def add(name: str, tensor: torch.Tensor) -> None:
        entries.append(_entry(name, tensor.detach(), world, sets))

    params = list(model.named_parameters())
    for name, param in params:
        add(name, param)
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
    return entries


def _optimizer_tensors(
    optimizer: torch.optim.Optimizer, params: list[tuple[str, nn.Parameter]]
) -> Iterator[tuple[str, str, torch.Tensor]]:
    names = {id(p): n for n, p in params}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    yield names.get(id(p), f"<param {id(p):#x}>"), key, value


def _entry(
    name: str,
    tensor: torch.Tensor,
    world: int,
    sets: dict[tuple[int, str], tuple[tuple[int, ...], ...]],
) -> _Entry:
    dtensor = as_dtensor(tensor)
    if dtensor is None:
        return _Entry(name, tensor, tensor, f"{tensor.dtype}", None)
    layout = f"{dtensor.dtype} {tuple(dtensor.placements)} mesh {tuple(dtensor.device_mesh.shape)}"
    mesh, placements = dtensor.device_mesh, dtensor.placements
    key = (id(mesh), str(placements))
    if key not in sets:
        sets[key] = _replica_sets(mesh.mesh, placements) if world > 1 else ()
    replicas = sets[key]
    return _Entry(name, tensor, dtensor.to_local(), layout, replicas)


def _replica_sets(
    mesh: torch.Tensor, placements: Sequence[Placement]
) -> tuple[tuple[int, ...], ...]:
    """Groups of ranks holding the same piece: equal mesh coordinates on every non-Replicate dim.

    A 2x2 HSDP mesh [[0, 1], [2, 3]] with (Replicate(), Shard(0)) gives ((0, 2), (1, 3));
    a 1-D mesh [0, 1] with (Shard(0),) gives ((0,), (1,)): nothing to compare by value.
    """
    keep = [d for d, p in enumerate(placements) if not p.is_replicate()]
    sets: dict[tuple[int, ...], list[int]] = {}
    for coord in itertools.product(*(range(size) for size in mesh.shape)):
        sets.setdefault(tuple(coord[d] for d in keep), []).append(int(mesh[coord]))
    return tuple(tuple(sorted(sets[key])) for key in sorted(sets))


def _summary(entry: _Entry) -> torch.Tensor:
    flat = entry.local.detach().reshape(-1).to(torch.float64)
    # crc32 < 2^32 is exact in float64, so equal layouts give bit-equal first columns.
    layout = torch.tensor([float(zlib.crc32(entry.layout.encode()))], dtype=torch.float64)
    if flat.numel() == 0:
        return torch.cat([layout, torch.zeros(3, dtype=torch.float64)])
    # Weights in [1, 2] make the fourth number depend on positions: swapped entries show up.
    weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
    sums = torch.stack(
        [flat.mean(), flat.square().mean().sqrt(), (flat * weights).sum() / weights.sum()]
    )
    return torch.cat([layout, sums.cpu()])


def _compare_entry(
    entry: _Entry, rows: torch.Tensor, atol: float, world: int
) -> tuple[list[Mismatch], bool]:
    """Mismatches of one tensor (``rows`` is [world, 4]) and whether any values were compared."""
    layout_groups = _groups(rows[:, :1], list(range(world)), 0.0)
    if len(layout_groups) > 1:
        return [Mismatch(entry.name, layout_groups, float("nan"), "layout")], True
    replicas = entry.replicas if entry.replicas is not None else (tuple(range(world)),)
    found: list[Mismatch] = []
    for index, ranks in enumerate(replicas):
        if len(ranks) < 2:
            continue
        groups = _groups(rows[:, 1:], list(ranks), atol)
        if len(groups) > 1:
            ref = rows[groups[0][0], 1:]
            diff = float((rows[list(ranks), 1:] - ref).abs().nan_to_num(float("inf")).max())
            name = entry.name if len(replicas) == 1 else f"{entry.name} (shard {index})"
            found.append(Mismatch(name, groups, diff))
    return found, any(len(ranks) > 1 for ranks in replicas)


def _groups(rows: torch.Tensor, ranks: list[int], atol: float) -> tuple[tuple[int, ...], ...]:
    """Ranks whose rows agree, largest group first (the lowest rank's on a tie)."""
    groups: list[list[int]] = []
    for rank in ranks:
        for group in groups:
            if _close(rows[group[0]], rows[rank], atol):
                group.append(rank)
                break
        else:
            groups.append([rank])
    groups.sort(key=lambda g: (-len(g), g[0]))
    return tuple(tuple(g) for g in groups)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    # A NaN on every rank is the same NaN everywhere: in sync (if broken) rather than diverged.
    close = (a == b) | ((a - b).abs() <= atol)
    return bool((close | (a.isnan() & b.isnan())).all())


def _ranks(group: tuple[int, ...]) -> str:
    return f"rank {group[0]}" if len(group) == 1 else f"ranks {list(group)}"
