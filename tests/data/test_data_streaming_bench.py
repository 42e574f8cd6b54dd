"""benchmarks/streaming_peers.py in its smallest mode against the real S3 server, with only
rankwise (the peers live in a venv of their own): it prints its table, rankwise's kill at 2
ranks and resume at 3 reads every row once, the server counted GETs and bytes, and each
absent peer is skipped with how to install it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.timeout(120)


def test_the_peers_benchmark_runs_rankwise_against_the_real_server(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/streaming_peers.py",
            *(
                "--rows",
                "1024",
                "--cols",
                "16",
                "--workers",
                "0",
                "--out",
                str(tmp_path / "o.json"),
            ),
            *("--skip", "s3fs file object (default cache), rankwise plan"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert "| reader | conversion s | epoch s | GETs | bytes / file |" in out
    row = re.search(
        r"^\| rankwise s3 \| 0\.0 \| [\d.]+ \| (\d+) \| ([\d.]+) \| (.+) \|$", out, re.M
    )
    assert row is not None, out
    assert int(row[1]) > 0 and float(row[2]) >= 1.0
    assert row[3].startswith("exact"), row[3]
    for peer in ("LitData", "MosaicML Streaming", "HF datasets (Parquet, streaming)"):
        if f"| {peer} |" not in out:
            skip = rf"^{re.escape(peer)}: not installed, skipped \(pip install "
            assert re.search(skip, out, re.M), out
    report = json.loads((tmp_path / "o.json").read_text())
    (mine,) = [r for r in report["results"] if r["reader"] == "rankwise s3"]
    assert mine["rows_read"] == 1024 and mine["bytes"] > 0 and mine["gets"] == int(row[1])
