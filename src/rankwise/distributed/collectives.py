"""Collectives over the live group; identities in a world of one.

Thin wrappers over ``torch.distributed`` that (1) work unchanged when no process group exists,
so single-process runs need no ``if`` around them, (2) take the reduction as a plain string,
and (3) check their arguments with messages that say what to pass instead.
"""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from rankwise.distributed.group import device, get_world_size, has_group

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # gloo has no AVG: sum, then divide by the world size
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


def _distributed() -> bool:
    return has_group() and dist.get_world_size() > 1


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks and return it.

    ``op`` is one of ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"product"``.

    >>> t = torch.tensor([1.0, 2.0])
    >>> all_reduce(t, op="mean")  # world of one: unchanged
    tensor([1., 2.])
    """
    key = op.lower() if isinstance(op, str) else op
    if key not in _OPS:
        raise ValueError(f"op {op!r} is not supported; use one of {sorted(_OPS)}.")
    if key == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(
            f"op='mean' needs a floating-point tensor, got {tensor.dtype}; "
            "convert with tensor.float() or reduce with op='sum'."
        )
    if _distributed():
        dist.all_reduce(tensor, op=_OPS[key])
        if key == "mean":
            tensor.div_(dist.get_world_size())
    return tensor


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> list[torch.Tensor]:
    """Fill ``tensor_list[r]`` with rank r's ``tensor``; ``len(tensor_list)`` == world size."""
    world = get_world_size()
    if len(tensor_list) != world:
        raise ValueError(
            f"all_gather needs one output tensor per rank: got {len(tensor_list)} for a world "
            f"of {world}; build it as [torch.empty_like(t) for _ in range({world})]."
        )
    if _distributed():
        dist.all_gather(tensor_list, tensor)
    else:
        tensor_list[0].copy_(tensor)
    return tensor_list


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with rank ``src``'s, in place."""
    _check_src(src)
    if _distributed():
        dist.broadcast(tensor, src=src)
    return tensor


def scatter(
    tensor: torch.Tensor,
    scatter_list: Sequence[torch.Tensor] | None = None,
    src: int = 0,
) -> torch.Tensor:
    """Rank r receives ``scatter_list[r]`` (given on ``src`` only) into ``tensor``."""
    _check_src(src)
    world = get_world_size()
    rank = dist.get_rank() if _distributed() else 0
    if rank == src and (scatter_list is None or len(scatter_list) != world):
        got = "None" if scatter_list is None else f"{len(scatter_list)} tensors"
        raise ValueError(
            f"scatter on the source rank {src} needs scatter_list with one tensor per rank "
            f"({world}), got {got}."
        )
    if _distributed():
        dist.scatter(tensor, list(scatter_list) if rank == src and scatter_list else None, src)
    else:
        assert scatter_list is not None  # checked above: rank == src in a world of one
        tensor.copy_(scatter_list[0])
    return tensor


def reduce_metrics(
    metrics: Mapping[str, float | torch.Tensor], weight: float = 1.0
) -> dict[str, float]:
    """Weighted mean of each metric across ranks, in one collective.

    ``weight`` is this rank's share, usually its number of samples, which makes the result the
    exact mean over all samples even when ranks saw different counts:

    rank 0: ``{"loss": 1.0}``, weight 3; rank 1: ``{"loss": 2.0}``, weight 1
    -> every rank gets ``{"loss": 1.25}``.

    Every rank must pass the same keys; a mismatch raises instead of mixing metrics up.
    """
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(
            f"weight ({weight}) must be a finite number >= 0; pass this rank's sample count."
        )
    keys = sorted(metrics)
    values = [float(metrics[k]) for k in keys]
    if not _distributed():
        return dict(zip(keys, values, strict=True))
    device = collective_device()
    # Agree on the names first, exactly, and in one collective: [n, -n, sig, -sig] under MAX
    # gives every rank (max, -min) of both, so all see any mismatch and raise together; none
    # is left waiting in the next collective with a buffer of another size.
    signature = float(zlib.crc32("\0".join(keys).encode()))
    agree = torch.tensor(
        [len(keys), -len(keys), signature, -signature], dtype=torch.float64, device=device
    )
    dist.all_reduce(agree, op=dist.ReduceOp.MAX)
    if agree[0].item() != -agree[1].item() or agree[2].item() != -agree[3].item():
        _raise_key_mismatch(keys)
    # A rank with no samples (weight 0) may well report NaN, the mean of nothing: it must
    # contribute nothing rather than turn every rank's result into NaN. float64 keeps large
    # sums exact. Layout: [w*v_0, ..., w*v_{k-1}, w].
    contributions = [weight * v if weight else 0.0 for v in values]
    reduced = torch.tensor([*contributions, weight], dtype=torch.float64, device=device)
    dist.all_reduce(reduced)
    reduced = reduced.cpu()
    total_weight = reduced[-1].item()
    if total_weight == 0:
        raise ValueError("reduce_metrics: the weights sum to 0 on all ranks; nothing to average.")
    return {k: reduced[i].item() / total_weight for i, k in enumerate(keys)}


def _raise_key_mismatch(keys: list[str]) -> None:
    raise ValueError(
        f"reduce_metrics got different metric names on different ranks (this rank: {keys}); "
        "pass the same keys on every rank."
    )


def collective_device() -> torch.device:
    """Where a tensor must live for this group's collectives: :func:`device` (``cuda:<local
    rank>``, the current CUDA device) when the backend is NCCL alone, which rejects CPU
    tensors; else the CPU (gloo, and the ``"cpu:gloo,cuda:nccl"`` pair, which reduces CPU
    tensors over gloo while the model computes on :func:`device`).

    >>> collective_device()       # no process group
    device(type='cpu')
    """
    if has_group() and dist.get_backend() == "nccl":
        return device()
    return torch.device("cpu")


def _check_src(src: int) -> None:
    world = get_world_size()
    if not 0 <= src < world:
        raise ValueError(f"src ({src}) must be a rank in 0..{world - 1}.")


# -- plain values between ranks, never a peer's pickle -------------------------------------------


def broadcast_plain(value: Any, src: int = 0, group: dist.ProcessGroup | None = None) -> Any:
    """Rank ``src``'s ``value`` on every rank of ``group`` (the others pass anything, e.g.
    None). ``value`` holds plain values only (tensors, numbers, strings, None, lists, tuples,
    dicts): it travels as ``torch.save`` bytes and is read with ``torch.load(weights_only=True)``,
    so a peer can send data but never code (``broadcast_object_list`` unpickles whatever it
    gets). Received tensors are on the CPU. A collective.

    >>> broadcast_plain({"step": 3})  # world of one: unchanged
    {'step': 3}
    """
    if not _distributed():
        return value
    device = _device_of(group)
    mine = _encode(value) if dist.get_rank() == src else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    data = mine.to(device) if dist.get_rank() == src else torch.empty(
        int(size.item()), dtype=torch.uint8, device=device
    )  # fmt: skip
    dist.broadcast(data, src=src, group=group)
    return _decode(data)


def all_gather_plain(value: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``value`` (plain values, as :func:`broadcast_plain`), in rank order of
    ``group`` (default: the whole world); never a peer's pickle. A collective.

    >>> all_gather_plain(7)  # world of one
    [7]
    """
    if not _distributed():
        return [value]
    device = _device_of(group)
    mine = _encode(value).to(device)
    count = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(count)]
    size = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: mine.numel()] = mine
    parts = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return [_decode(part[: int(s.item())]) for part, s in zip(parts, sizes, strict=True)]


def _device_of(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group``'s collectives take their tensors: the CPU for a gloo group (a
    background group beside an NCCL world), else :func:`collective_device`."""
    if group is not None and dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return collective_device()


def _encode(value: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _decode(data: torch.Tensor) -> Any:
    raw = io.BytesIO(data.cpu().numpy().tobytes())
    return torch.load(raw, map_location="cpu", weights_only=True)
