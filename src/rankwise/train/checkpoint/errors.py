"""What a checkpoint that cannot be used raises and warns: :class:`CheckpointError` (torn,
corrupt, incomplete or untrusted, naming the checkpoint and why) and :class:`CheckpointWarning`
(one skipped for an older one)."""

from __future__ import annotations

from rankwise.distributed.errors import RankwiseWarning


class CheckpointError(RuntimeError):
    """A checkpoint file is torn, corrupt or incomplete; the message names the file and why."""


class CheckpointWarning(RankwiseWarning):
    """A checkpoint was skipped because it is not valid (the message says which and why)."""
