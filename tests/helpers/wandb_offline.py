"""Read W&B offline runs back (``WANDB_MODE=offline``): the ``run-<id>.wandb`` file each process
writes in ``WANDB_DIR/wandb/offline-run-<time>-<id>/`` and ``wandb sync`` would upload.

wandb (0.31) has no Python reader of its own any more (its Go core writes and reads the file),
so this is the file's documented framing: a 7-byte header (``:W&B``, magic 0xBEE1, version),
then LevelDB's log format (32 KiB blocks of records, each with a CRC32, a length and a type:
full, first, middle, last) around wandb's own protobuf ``Record`` messages, which wandb's
``wandb_internal_pb2`` parses.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_RECORD = struct.Struct("<IHB")  # crc32, length, type
_FULL, _LAST = 1, 4


@dataclass
class OfflineRun:
    """One process's part of a W&B run: its folder, run id, config, history rows, artifacts and
    exit code."""

    folder: Path
    run_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    exit_code: int | None = None  # the run's end as its process recorded it (None: no end)


def _payloads(path: Path) -> list[bytes]:
    data = path.read_bytes()
    ident, magic, _ = _HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    pos, pending, out = _HEADER.size, b"", []
    while pos + _RECORD.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD.size:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = _RECORD.unpack_from(data, pos)
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        pending += data[pos + _RECORD.size : pos + _RECORD.size + length]
        pos += _RECORD.size + length
        if kind in (_FULL, _LAST):
            out.append(pending)
            pending = b""
    return out


def read_offline_run(folder: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = folder.glob("run-*.wandb")
    run = OfflineRun(folder)
    for payload in _payloads(path):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            for item in record.run.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            run.history.append(row)
        elif kind == "artifact":
            run.artifacts += [entry.path for entry in record.artifact.manifest.contents]
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every offline run folder under ``wandb_dir`` (``WANDB_DIR``), oldest first."""
    folders = sorted((wandb_dir / "wandb").glob("offline-run-*"))
    return [read_offline_run(folder) for folder in folders]
