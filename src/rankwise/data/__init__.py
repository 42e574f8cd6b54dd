"""Who sees which sample, in which order (``rankwise.data``)."""

from rankwise.data.partition import (
    DistributedRangeSplitter,
    contiguous_owner,
    contiguous_range,
    strided_count,
    strided_positions,
)

__all__ = [
    "DistributedRangeSplitter",
    "contiguous_owner",
    "contiguous_range",
    "strided_count",
    "strided_positions",
]
