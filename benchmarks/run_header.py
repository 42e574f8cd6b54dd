"""What every benchmark's JSON result starts with, so a figure can be traced and rerun: the
date, the machine, the exact command and the torch version (benchmarks/trainer.py,
benchmarks/workloads.py; they run as scripts, with this folder first on the import path)."""

from __future__ import annotations

import platform
import sys
import time
from typing import Any

import torch


def run_header(**extra: Any) -> dict[str, Any]:
    """``{"date", "machine", "command", "torch"}`` of this run, then ``extra`` in order."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "command": "python " + " ".join(sys.argv),
        "torch": torch.__version__,
        **extra,
    }
