"""``FetchDataset.state_dict()``: the rest of an epoch as a small dict of plain values, checked
on load so a state that does not fit is refused with the reason and the fix.

>>> from rankwise.data.fetch_plan import Work
>>> state = work_to_state(Work(10, 6, ((0, 4, 3, 4),)), epoch=2, seed=0, num_rows=10,
...                       world_size=3, num_workers=2)
>>> state["consumed"], state["next"], state["pieces"]
(5, 6, [[0, 4, 3, 4]])
>>> state_to_work(state, num_rows=10, length=10)
(Work(length=10, next=6, pieces=((0, 4, 3, 4),)), 2, 0)
"""

from __future__ import annotations

from typing import Any

from rankwise.data.fetch_plan import Piece, Work
from rankwise.data.permutation import ORDER_VERSION
from rankwise.validation import check_epoch, check_int

__all__ = ["state_to_work", "work_to_state"]

_KEYS = ("version", "epoch", "seed", "num_rows", "length", "next", "pieces")


def work_to_state(
    work: Work, *, epoch: int, seed: int, num_rows: int, world_size: int, num_workers: int
) -> dict[str, Any]:
    """The state of a FetchDataset whose epoch ``epoch`` has ``work`` left.

    ``world_size`` and ``num_workers`` record who saved it (a resume may use others).
    """
    return {
        "version": ORDER_VERSION,
        "epoch": epoch,
        "seed": seed,
        "num_rows": num_rows,
        "length": work.length,
        "consumed": work.length - work.total,
        "next": work.next,
        "pieces": [list(p) for p in work.pieces],
        "world_size": world_size,
        "num_workers": num_workers,
    }


def state_to_work(state: dict[str, Any], *, num_rows: int, length: int) -> tuple[Work, int, int]:
    """``(work, epoch, seed)`` from a state, checked against a dataset of ``num_rows`` rows
    whose strategy gives epochs of ``length`` positions."""
    missing = [k for k in _KEYS if k not in state]
    if missing:
        raise ValueError(
            f"FetchDataset state is missing {missing}; pass a dict from FetchDataset."
            f"state_dict() (keys {list(_KEYS)})."
        )
    if state["version"] != ORDER_VERSION:
        raise ValueError(
            f"FetchDataset state has order version {state['version']!r}, but this rankwise "
            f"makes orders of version {ORDER_VERSION}; resume it with the rankwise release "
            "that saved it, or start the epoch afresh (set_epoch) instead of loading it."
        )
    saved = check_int("state['num_rows']", state["num_rows"])
    if saved != num_rows:
        raise ValueError(
            f"FetchDataset state was saved for a source of {saved} rows but this one has "
            f"{num_rows}; load a state saved for the same source."
        )
    if check_int("state['length']", state["length"]) != length:
        raise ValueError(
            f"FetchDataset state was saved for epochs of {state['length']} positions but this "
            f"dataset's strategy gives {length}; build it with the same strategy (block_size, "
            "indices, drop_last) as the dataset that saved the state."
        )
    nxt = check_int("state['next']", state["next"], maximum=length)
    pieces = tuple(_piece(p, nxt) for p in _list("state['pieces']", state["pieces"]))
    work = Work(length, nxt, pieces)
    epoch = check_epoch(state["epoch"], "state['epoch']")
    return work, epoch, check_int("state['seed']", state["seed"])


def _list(name: str, value: object) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{name} ({value!r}) must be a list; the state is corrupt.")
    return list(value)


def _piece(value: object, nxt: int) -> Piece:
    """A piece ``[start, stop, lo, hi]`` of a fetch begun before position ``nxt``."""
    parts = _list("a piece of state['pieces']", value)
    if len(parts) != 4:
        raise ValueError(f"a piece of state['pieces'] ({value!r}) must be [start, stop, lo, hi].")
    start, stop, lo, hi = (check_int("a piece of state['pieces']", v) for v in parts)
    if not (start < stop <= nxt and lo < hi <= stop - start):
        raise ValueError(
            f"piece {parts} of state['pieces'] must satisfy start < stop <= next ({nxt}) and "
            "lo < hi <= stop - start; the state is corrupt or from another dataset."
        )
    return start, stop, lo, hi
