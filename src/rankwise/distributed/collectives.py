"""Collectives over the live group; identities in a world of one.

Thin wrappers over ``torch.distributed`` that (1) work unchanged when no process group exists,
so single-process runs need no ``if`` around them, (2) take the reduction as a plain string,
and (3) check their arguments with messages that say what to pass instead.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

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


def broadcast_bytes(data: bytes | None, src: int = 0) -> bytes:
    """Rank ``src``'s ``data`` on every rank (the others pass None); a collective.

    The bytes travel as a uint8 tensor after their length: nothing from a peer is unpickled,
    so what arrives is data, never code (decode it as text or JSON).

    >>> broadcast_bytes(b'{"wandb": "1x2y3z"}')  # world of one: unchanged
    b'{"wandb": "1x2y3z"}'
    """
    _check_src(src)
    if not _distributed():
        if data is None:
            raise ValueError("broadcast_bytes in a world of one needs the data, got None.")
        return bytes(data)
    on_src = dist.get_rank() == src
    if on_src and data is None:
        raise ValueError(f"broadcast_bytes: the source rank {src} must pass the data, got None.")
    where = collective_device()
    size = torch.tensor([len(data) if on_src and data is not None else 0], device=where)
    dist.broadcast(size, src=src)
    buffer = torch.empty(int(size.item()), dtype=torch.uint8)
    if not buffer.numel():
        return b""
    if on_src and data is not None:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    buffer = buffer.to(where)
    dist.broadcast(buffer, src=src)
    return buffer.cpu().numpy().tobytes()


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
