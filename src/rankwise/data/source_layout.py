"""Where a file's rows lie, in bytes: an ``.npy`` header, an HDF5 dataset's contiguous block or
chunk index, read once in a few small ranged reads. From that, the byte ranges of any rows.

A :class:`RowLayout` is a list of *extents*: runs of rows ``[first, stop)`` stored back to back
from a byte offset (one for an ``.npy`` or a contiguous HDF5 dataset, one per chunk for a
chunked one), rows of ``row_bytes`` bytes each::

    rows 0-9 of 8 bytes in chunks of 4 at offsets 100, 900, 500:
    extents (0, 4, 100), (4, 8, 900), (8, 10, 500); rows 3-5 -> bytes [124, 132), [900, 916)

>>> RowLayout([(0, 4, 100), (4, 8, 900), (8, 10, 500)], row_bytes=8).ranges([(3, 6)])
[(124, 132), (900, 916)]
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["RangeFile", "RowLayout", "SeekableFile", "hdf5_layout", "npy_layout"]

# The first read of an .npy: its header (v1: at most 64 KiB, in practice 128 bytes).
NPY_HEAD = 4096


class RowLayout:
    """The byte ranges of rows (see the module): ``extents`` are ``(first_row, stop_row,
    byte_offset)``; a row holds ``row_bytes`` bytes."""

    def __init__(self, extents: Sequence[tuple[int, int, int]], row_bytes: int) -> None:
        self.extents = sorted((int(a), int(b), int(o)) for a, b, o in extents)
        self.firsts = np.array([e[0] for e in self.extents], dtype=np.int64)
        self.row_bytes = int(row_bytes)

    def ranges(self, runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The byte ranges of the row runs ``[a, b)`` (sorted), in row order."""
        out: list[tuple[int, int]] = []
        for a, b in runs:
            i = int(np.searchsorted(self.firsts, a, side="right")) - 1
            while a < b:
                first, stop, offset = self.extents[i]
                end = min(b, stop)
                out.append(
                    (offset + (a - first) * self.row_bytes, offset + (end - first) * self.row_bytes)
                )
                a, i = end, i + 1
        return out


def npy_layout(
    read: Callable[[int, int], bytes], size: int, where: str
) -> tuple[np.dtype[Any], tuple[int, ...], RowLayout]:
    """The dtype, shape and row layout of an ``.npy`` of ``size`` bytes, from its header
    (``read(start, stop)`` reads bytes; ``where`` names the file in errors)."""
    head = read(0, min(size, NPY_HEAD))
    stream = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(stream)
        length = int.from_bytes(head[8:10] if version == (1, 0) else head[8:12], "little")
        offset = (10 if version == (1, 0) else 12) + length
        if offset > len(head):
            head = read(0, offset)
            stream = io.BytesIO(head)
            np.lib.format.read_magic(stream)
        reader = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = reader(stream)
    except ValueError as e:
        raise ValueError(
            f"{where} is not a readable .npy file ({e}); write it with numpy.save."
        ) from None
    if fortran and len(shape) > 1:
        raise ValueError(
            f"{where} is stored in Fortran order, so a row's bytes are not contiguous; save it "
            "with numpy.save(path, numpy.ascontiguousarray(x))."
        )
    if dtype.hasobject or not shape:
        raise ValueError(
            f"{where} holds {'objects' if dtype.hasobject else 'a scalar'} ({dtype}, shape "
            f"{shape}); FetchDataset reads numeric arrays with rows along axis 0."
        )
    row_bytes = dtype.itemsize * math.prod(shape[1:])
    if offset + shape[0] * row_bytes > size:
        raise ValueError(
            f"{where} is truncated: its header says {offset + shape[0] * row_bytes} bytes, the "
            f"object has {size}; write it again."
        )
    return dtype, tuple(shape), RowLayout([(0, shape[0], offset)], row_bytes)


def hdf5_layout(dataset: Any, where: str) -> RowLayout:
    """The row layout of an h5py dataset: its contiguous block, or its chunks when each chunk
    holds whole rows. Compressed (filtered) or unallocated data cannot be read by byte ranges:
    a clear error names the fix."""
    name = f"{where}:{dataset.name}"
    shape, row_bytes = dataset.shape, dataset.dtype.itemsize * math.prod(dataset.shape[1:])
    plist = dataset.id.get_create_plist()
    if plist.get_nfilters():
        raise ValueError(
            f"{name} is compressed ({dataset.compression or 'a filter'}), so its rows cannot be "
            "read as byte ranges; write it uncompressed (anndata: write_h5ad(path) without "
            "compression=), or open it yourself and pass the h5py dataset as the source."
        )
    import h5py  # present: this file was opened with it

    layout = plist.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        offset = dataset.id.get_offset()
        if offset is None and shape[0]:
            raise ValueError(f"{name} has no data written (unallocated); write its values.")
        return RowLayout([(0, shape[0], offset or 0)], row_bytes)
    if layout != h5py.h5d.CHUNKED or tuple(dataset.chunks[1:]) != tuple(shape[1:]):
        raise ValueError(
            f"{name} is stored in chunks {dataset.chunks} that split its rows ({shape}); "
            "rewrite it contiguous or chunked along axis 0 only."
        )
    per = dataset.chunks[0]
    extents: list[tuple[int, int, int]] = []
    dataset.id.chunk_iter(
        lambda info: extents.append(
            (info.chunk_offset[0], min(info.chunk_offset[0] + per, shape[0]), info.byte_offset)
        )
    )
    if sum(b - a for a, b, _ in extents) != shape[0]:
        raise ValueError(f"{name} has chunks never written (unallocated); write its values.")
    return RowLayout(extents, row_bytes)


class SeekableFile(io.RawIOBase):
    """The position of a read-only file of ``size`` bytes that a parser (h5py, pyarrow) seeks
    in; a subclass reads."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos


class RangeFile(SeekableFile):
    """A read-only file over ``read(start, stop)`` for h5py to parse metadata from: blocks of
    ``block`` bytes, each read once and kept (metadata is small), so opening an HDF5 file and
    its chunk index costs a few ranged reads, not the file."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, block: int = 1 << 18):
        super().__init__(size)
        self._read, self._block = read, block
        self._blocks: dict[int, bytes] = {}

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), max(0, self._size - self._pos))
        view, done = memoryview(buffer).cast("B"), 0
        while done < want:
            index, skip = divmod(self._pos + done, self._block)
            if index not in self._blocks:
                start = index * self._block
                self._blocks[index] = self._read(start, min(start + self._block, self._size))
            piece = self._blocks[index][skip : skip + want - done]
            view[done : done + len(piece)] = piece
            done += len(piece)
        self._pos += done
        return done
