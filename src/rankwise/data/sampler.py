"""``DistributedSampler``: torch's sampler semantics, O(1) memory, and an elastic resume cursor.

The epoch's *global order* is the permutation of ``[0, N)`` for ``(seed, epoch)`` (or
``0..N-1`` without shuffle), padded by wrapping to a multiple of the world size R (torch's
rule; ``drop_last`` trims instead). Rank r takes positions ``r, r+R, r+2R, ...`` of it::

    N=10, R=4, no shuffle: global order 0 1 2 3 4 5 6 7 8 9 0 1   (2 wrapped to pad to 12)
    rank 0 -> [0, 4, 8]   rank 1 -> [1, 5, 9]   rank 2 -> [2, 6, 0]   rank 3 -> [3, 7, 1]

Every rank consumes in lockstep, so one number describes the whole world's progress: the
*cursor*, how many positions of the global order all ranks together have consumed. The trainer
moves it with :meth:`DistributedSampler.advance` (this rank's sample count; the sampler
multiplies by R); :meth:`~DistributedSampler.state_dict` saves it. Loaded under another world
size R', the rest of the order (positions ``consumed..N-1``) is split strided over the new
ranks, padded to a multiple of R' by the same rule — so each sample is seen exactly once in the
epoch across the stop (plus the usual < R' padding duplicates)::

    N=10, R=4, stopped after 1 sample per rank: consumed = 4 (samples 0 1 2 3)
    resumed with R'=3: rest = 4 5 6 7 8 9 -> rank 0 [4, 7], rank 1 [5, 8], rank 2 [6, 9]

Global batches: with a global batch of B (B/R per rank), the k-th batches of all ranks together
are exactly positions ``[kB, (k+1)B)`` of the global order — the same samples whatever R is.
Where R does not divide B, :class:`~rankwise.data.shares.GlobalBatchShares` takes the order a
global batch at a time (:meth:`~DistributedSampler.advance_positions` moves the cursor).

It *is* a ``torch.utils.data.distributed.DistributedSampler`` (a subclass with torch's
attributes), so Lightning Fabric, Accelerate and anything that checks ``isinstance`` leave it
alone instead of sharding a second time. Inside torchdata's ``StatefulDataLoader`` the pass
iterator is ``Stateful``: ``loader.state_dict()`` records the position, and a fresh loader
resumes there in O(1) instead of replaying the indices already yielded.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
import torch.utils.data.distributed as tud_distributed

from rankwise.data.partition import position_chunks, resolve_world, strided_positions
from rankwise.data.passes import SamplerPass
from rankwise.data.permutation import DEFAULT_CHUNK, ORDER_VERSION, Permutation
from rankwise.distributed.errors import RankwiseWarning
from rankwise.validation import check_epoch, check_int

__all__ = ["DistributedSampler"]

_STATE_KEYS = ("version", "epoch", "seed", "dataset_size", "consumed")


class DistributedSampler(tud_distributed.DistributedSampler[int]):
    """Shards (and shuffles) ``range(N)`` over ranks; a torch ``DistributedSampler`` subclass.

    ``dataset_or_size`` is a sized dataset or the int N (``dataset=`` / ``dataset_size=`` are
    accepted as keywords). ``num_replicas`` / ``rank`` default to the process group, else the
    torchrun variables, else a world of one -- torch's constructor is only called once they are
    known, so no process group is needed. torch's attributes keep torch's meaning: ``dataset``
    (``range(N)`` when given an int), ``num_replicas``, ``rank``, ``epoch``, ``seed``,
    ``shuffle``, ``drop_last``, ``num_samples`` (indices per rank in a whole epoch) and
    ``total_size`` (the padded length, ``num_samples * num_replicas``).

    >>> s = DistributedSampler(10, num_replicas=4, rank=2, shuffle=False)
    >>> list(s), len(s), s.num_samples, s.total_size
    ([2, 6, 0], 3, 3, 12)
    >>> s.advance(1)                   # every rank used one sample: 4 positions consumed
    >>> s.state_dict()["consumed"]
    4
    >>> t = DistributedSampler(10, num_replicas=3, rank=0, shuffle=False)
    >>> t.load_state_dict(s.state_dict()); list(t)   # rest 4..9 re-split over 3 ranks
    [4, 7]
    """

    def __init__(
        self,
        dataset_or_size: Sized | int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        dataset: Sized | None = None,
        dataset_size: int | None = None,
    ) -> None:
        given = [x for x in (dataset_or_size, dataset, dataset_size) if x is not None]
        if len(given) != 1:
            raise ValueError(
                "pass the data exactly once: DistributedSampler(dataset_or_size) with a sized "
                f"dataset or an int (got {len(given)} of dataset_or_size / dataset / dataset_size)."
            )
        self._n = _num_samples(given[0])
        rank, num_replicas = resolve_world(rank, num_replicas, "num_replicas")
        self._epoch = 0
        self._shared: torch.Tensor | None = None  # see shared_epoch()
        data = range(self._n) if isinstance(given[0], int | np.integer) else given[0]
        # torch's own constructor, with the world already resolved: it never asks for a process
        # group, and sets torch's attributes (num_samples, total_size, ...) its own way.
        super().__init__(
            data,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=bool(shuffle),
            seed=check_int("seed", seed),
            drop_last=bool(drop_last),
        )
        self._start = 0  # position where the current split began (0, or a resume point)
        self._cursor = 0  # positions of the global order consumed by all ranks together
        self._pass_start: int | None = None  # cursor at the last iter() (see __len__)
        self._perm: Permutation | None = None
        self._drained = False  # a pass of this epoch ran to its end (see __iter__)
        self._warned = False

    # -- the global order ----------------------------------------------------------------------

    def _torch_sizes(self) -> None:
        # torch's rule for a whole epoch: drop_last trims to a multiple of R, else pad up.
        r = self.num_replicas
        self.num_samples = self._n // r if self.drop_last else -(-self._n // r)
        self.total_size = self.num_samples * r

    def _end(self) -> int:
        """One past the last position of the global order under the current world size."""
        rest = self._n - self._start
        per_rank = rest // self.num_replicas if self.drop_last else -(-rest // self.num_replicas)
        return self._start + per_rank * self.num_replicas

    def _permutation(self) -> Permutation:
        p = self._perm
        if p is None or (p.seed, p.epoch) != (self.seed, self.epoch):
            p = self._perm = Permutation(self._n, self.seed, self.epoch)
        return p

    def _indices(self, positions: np.ndarray) -> np.ndarray:
        positions = positions % max(self._n, 1)  # padding wraps to the start of the order
        return self._permutation()[positions] if self.shuffle else positions

    def __iter__(self) -> Iterator[int]:
        """This rank's indices from the cursor to the end of the epoch.

        A finished epoch is never an empty pass: like torch's sampler, iterating again without
        ``set_epoch`` repeats the epoch's order, with a ``UserWarning`` (once per sampler) that
        names the fix, ``set_epoch(epoch + 1)``.
        """
        finished = self.num_samples > 0 and self._cursor >= self._end()
        if finished or (self._drained and self.shuffle and self._cursor == self._start):
            self._warn_repeat(finished)
            if finished:
                self._start = self._cursor = 0
        self._drained = False
        # The pass's start is recorded now, when DataLoader calls iter(), so len() stays put
        # while the loop advances the cursor. The pass lasts until the next iter(),
        # set_epoch() or load_state_dict() -- not until the iterator runs out: a DataLoader
        # drains it while assembling the last batch, before the loop body has run.
        self._pass_start = self._cursor
        return SamplerPass.start(self, self._cursor)

    def _warn_repeat(self, finished: bool) -> None:
        if self._warned:
            return
        self._warned = True
        why = "is finished" if finished else "was already iterated to its end"
        warnings.warn(
            f"DistributedSampler: epoch {self.epoch} {why} and set_epoch was not called, so "
            f"this pass repeats epoch {self.epoch}'s order (as torch's DistributedSampler "
            "does). Call sampler.set_epoch(epoch + 1) before each new epoch.",
            RankwiseWarning,
            stacklevel=3,
        )

    def __len__(self) -> int:
        """Indices this rank yields in the current pass (from the last ``iter()``), or, before
        the epoch's first pass, in the next one: the rest of the epoch from the cursor.

        Constant during a pass, although :meth:`advance` moves the cursor: a loop that reads
        ``len(loader)`` at every step sees the same number throughout. :meth:`remaining` is
        what is left of the epoch. ``num_samples`` is torch's whole-epoch count.
        """
        start = self._cursor if self._pass_start is None else self._pass_start
        return (self._end() - start) // self.num_replicas

    def rest_indices(self) -> list[int]:
        """This rank's indices from the cursor to the end of the epoch, as a list.

        Not a pass: ``len()`` and the cursor are unaffected (O(N/R) memory, so for lists the
        caller asked for; iterate the sampler to stream).

        >>> s = DistributedSampler(10, num_replicas=4, rank=3, shuffle=False)
        >>> s.rest_indices()
        [3, 7, 1]
        >>> s.advance(1); s.rest_indices()     # every rank took one: 4 positions consumed
        [7, 1]
        """
        mine = strided_positions(self._end(), self.num_replicas, self.rank, start=self._cursor)
        return [
            i for part in position_chunks(mine, DEFAULT_CHUNK) for i in self._indices(part).tolist()
        ]

    def remaining(self) -> int:
        """Indices left for this rank in the epoch, from the cursor (0 once it is finished)."""
        return (self._end() - self._cursor) // self.num_replicas

    # -- epoch and cursor ----------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = value
        if self._shared is not None:
            self._shared.fill_(value)

    def shared_epoch(self) -> torch.Tensor:
        """A 0-d int64 tensor in shared memory that always holds this sampler's epoch.

        Objects that follow the epoch from inside DataLoader workers (e.g.
        :class:`rankwise.augment.AugmentedDataset`) read it: a worker's copy of the sampler is
        a snapshot, persistent workers keep it for the whole run, but this tensor's storage is
        shared with the main process, so ``set_epoch`` reaches them. Created on first request,
        so samplers nobody follows cost no shared memory.
        """
        if self._shared is None:
            self._shared = torch.tensor(self._epoch, dtype=torch.int64).share_memory_()
        return self._shared

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order. A new epoch number rewinds the cursor to 0; the current
        one keeps it, so calling ``set_epoch(e)`` right after loading a state of epoch e resumes
        mid-epoch instead of restarting it."""
        epoch = check_epoch(epoch)
        if epoch != self.epoch:
            self.epoch, self._start, self._cursor, self._pass_start = epoch, 0, 0, None
            self._drained = False

    def advance(self, num_samples: int) -> None:
        """Record that this rank — and so, in lockstep, every rank — consumed ``num_samples``
        more samples of the epoch (call it after each step with the per-rank batch length).

        The cursor moves by ``num_samples * num_replicas`` positions; the next ``iter(self)``
        starts after them and :meth:`state_dict` saves them. Iterating never moves the cursor
        (a DataLoader reads ahead of what the model has consumed).
        """
        num_samples = check_int("num_samples", num_samples)
        if num_samples > self.remaining():
            raise ValueError(
                f"advance({num_samples}) passes the end of epoch {self.epoch}: only "
                f"{self.remaining()} "
                "samples are left on each rank; call set_epoch(next_epoch) to start the next."
            )
        self._cursor += num_samples * self.num_replicas

    def advance_positions(self, positions: int) -> None:
        """Record that all ranks together consumed ``positions`` more positions of the global
        order, in shares that need not be equal (a global batch split unevenly: see
        :class:`rankwise.data.shares.GlobalBatchShares`); :meth:`advance` is for equal shares.
        """
        self._cursor += check_int("positions", positions)

    def order_at(self, positions: np.ndarray) -> np.ndarray:
        """The dataset indices at ``positions`` of the epoch's global order (positions past N
        wrap to its start, torch's padding rule).

        >>> DistributedSampler(10, num_replicas=2, rank=0, shuffle=False).order_at(np.arange(9, 12))
        array([9, 0, 1])
        """
        return self._indices(positions)

    @property
    def consumed(self) -> int:
        """Positions of the epoch's global order consumed by all ranks together."""
        return self._cursor

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A small dict of plain values describing the whole world's position.

        ``dataset_size`` is N (not torch's per-rank ``num_samples``); ``consumed`` counts
        samples of the permutation (0..N) already used; it is N once the epoch is done
        (padding duplicates and a ``drop_last`` tail are not counted).
        ``version`` is the order algorithm (:data:`~rankwise.data.permutation.ORDER_VERSION`).

        >>> s = DistributedSampler(10, num_replicas=2, rank=0, shuffle=False)
        >>> s.advance(3)
        >>> {k: s.state_dict()[k] for k in ("dataset_size", "consumed")}, s.num_samples
        ({'dataset_size': 10, 'consumed': 6}, 5)
        """
        return self._state_at(self._cursor)

    def _state_at(self, position: int) -> dict[str, Any]:
        consumed = self._n if position >= self._end() else min(position, self._n)
        return {
            "version": ORDER_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "dataset_size": self._n,  # N (torch's attribute num_samples is per rank)
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "consumed": consumed,
            "world_size": self.num_replicas,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch under this sampler's world size (which may differ).

        The state's seed, shuffle and drop_last replace the constructor's: the interrupted
        order must be the one that continues. Raises ValueError for a state that does not fit,
        including one whose order ``version`` this code cannot reproduce.
        """
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            version = "" if "version" not in missing else _NO_VERSION
            raise ValueError(
                f"sampler state is missing {missing}{version}; pass a dict from "
                f"DistributedSampler.state_dict() (keys {list(_STATE_KEYS)})."
            )
        if state["version"] != ORDER_VERSION:
            raise ValueError(
                f"sampler state has order version {state['version']!r}, but this rankwise "
                f"reproduces version {ORDER_VERSION} only: resuming would continue a different "
                "order. Resume with the rankwise release that saved it, or start the epoch "
                "afresh (set_epoch) without loading the state."
            )
        n = check_int("state['dataset_size']", state["dataset_size"])
        if n != self._n:
            raise ValueError(
                f"sampler state was saved for a dataset of {n} samples but this sampler has "
                f"{self._n}; load a state saved for the same dataset."
            )
        consumed = check_int("state['consumed']", state["consumed"])
        if consumed > n:
            raise ValueError(
                f"state['consumed'] ({consumed}) must be <= state['dataset_size'] ({n}); "
                "the state is corrupt or from another sampler."
            )
        self.epoch = check_epoch(state["epoch"], "state['epoch']")
        self.seed = check_int("state['seed']", state["seed"])
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.drop_last = bool(state.get("drop_last", self.drop_last))
        self._torch_sizes()
        self._start = self._cursor = consumed
        self._pass_start = None
        self._drained = False

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(N={self._n}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
            f"epoch={self.epoch}, consumed={self._cursor})"
        )


_NO_VERSION = (
    " (a state without 'version' was saved before orders were versioned and its order cannot "
    f"be reproduced; this rankwise reproduces order version {ORDER_VERSION})"
)


def _num_samples(data: Sized | int) -> int:
    if isinstance(data, int | np.integer) and not isinstance(data, bool):
        return check_int("dataset_size", data)
    try:
        return check_int("len(dataset)", len(data))  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"dataset_or_size ({type(data).__name__}) must be an int or have a len(); "
            "pass DistributedSampler(len(dataset)) for an iterable dataset."
        ) from None
