"""The sampler's pass iterator: C-speed iteration that torchdata can save and restore in O(1).

``iter(DistributedSampler)`` returns a :class:`SamplerPass`. torchdata's ``StatefulDataLoader``
sees that it is ``Stateful`` (it has ``state_dict`` / ``load_state_dict``), saves its state in
``loader.state_dict()`` and, in a fresh loader, loads it into a fresh pass instead of replaying
every index already yielded (its fallback for plain iterators).

>>> from rankwise.data import DistributedSampler
>>> it = iter(DistributedSampler(10, num_replicas=2, rank=0, shuffle=False))
>>> next(it), next(it), it.state_dict()["consumed"]   # 2 indices per rank: 4 positions
(0, 2, 4)
>>> fresh = iter(DistributedSampler(10, num_replicas=2, rank=0, shuffle=False))
>>> fresh.load_state_dict(it.state_dict()); list(fresh)
[4, 6, 8]
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Any, Protocol, cast

import numpy as np

from rankwise.data.partition import strided_positions
from rankwise.data.permutation import DEFAULT_CHUNK

__all__ = ["PassOwner", "SamplerPass"]


class PassOwner(Protocol):
    """What a pass reads and moves on the sampler that started it (``DistributedSampler``
    satisfies it): the world's shape, the global order, and the cursor. A protocol, so this
    module does not import the sampler that imports it."""

    num_replicas: int
    rank: int
    _cursor: int
    _pass_start: int | None
    _drained: bool

    def _end(self) -> int: ...

    def _indices(self, positions: np.ndarray) -> np.ndarray: ...

    def _state_at(self, position: int) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _Chunks:
    """The source of a pass: this rank's indices, one list iterator per chunk of positions."""

    def __init__(self, sampler: PassOwner, origin: int) -> None:
        self.sampler = sampler
        self.origin = origin  # global position where the pass (or its resume) began
        self.before = 0  # indices of this rank in the chunks before the current one
        self.active: Iterator[int] = iter(())
        self.active_len = 0
        self.done = False

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> Iterator[int]:
        s = self.sampler
        self.before += self.active_len
        mine = strided_positions(
            s._end(), s.num_replicas, s.rank, start=self.origin + self.before * s.num_replicas
        )[:DEFAULT_CHUNK]  # one chunk at a time: memory stays flat for any N
        if not mine:
            self.active, self.active_len, self.done = iter(()), 0, True
            s._drained = True
            raise StopIteration
        positions = np.arange(mine.start, mine.stop, mine.step, dtype=np.int64)
        values = s._indices(positions).tolist()
        self.active, self.active_len = iter(values), len(values)
        return self.active

    def yielded(self) -> int:
        left = self.active.__length_hint__()  # type: ignore[attr-defined]
        return self.before + self.active_len - left


class SamplerPass(itertools.chain[int]):
    """One pass over this rank's indices; ``Stateful`` for torchdata's ``StatefulDataLoader``.

    An ``itertools.chain`` over the chunks' list iterators, so each index costs C-level
    iteration only; the position is recovered on demand from the current chunk's iterator.
    ``state_dict()`` is the sampler's state as if every rank had consumed what this pass
    yielded; ``load_state_dict()`` moves the pass there in O(1) (any world size).
    """

    _chunks: _Chunks

    @classmethod
    def start(cls, sampler: PassOwner, origin: int) -> SamplerPass:
        chunks = _Chunks(sampler, origin)
        # from_iterable builds an instance of cls (chain's constructor is a classmethod).
        self = cast(SamplerPass, cls.from_iterable(chunks))
        self._chunks = chunks
        return self

    def state_dict(self) -> dict[str, Any]:
        c = self._chunks
        return c.sampler._state_at(c.origin + c.yielded() * c.sampler.num_replicas)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = self._chunks
        if c.done:
            raise ValueError(
                "this sampler iterator is exhausted; load the state into a fresh one: "
                "it = iter(sampler); it.load_state_dict(state)."
            )
        c.sampler.load_state_dict(state)
        c.sampler._pass_start = c.origin = c.sampler._cursor
        collections.deque(c.active, maxlen=0)  # empty the chunk in hand (at most one chunk)
        c.before, c.active, c.active_len = 0, iter(()), 0
