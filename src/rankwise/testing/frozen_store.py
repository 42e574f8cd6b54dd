"""A job whose object store freezes mid-run: :func:`frozen_store`, for tests and the fault sweep.

The store is a SeaweedFS of its own (:func:`rankwise.testing.s3server.start_server`), SIGSTOPped
(it takes connections and never answers: a frozen server, not a dead one) once the job reaches
a point the caller names, and SIGCONTed some seconds later, and always before this returns.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FrozenStoreRun", "frozen_store"]

BUCKET = "frozen"


@dataclass
class FrozenStoreRun:
    """What :func:`frozen_store` saw: the launch's exit code and output, the checkpoints' URL,
    when (``time.time()``) the store was frozen and thawed (NaN: never), and the newest valid
    checkpoint there once the job ended (``(url, state)``, or None)."""

    returncode: int
    stdout: str
    stderr: str
    url: str
    frozen_at: float
    thawed_at: float
    latest: tuple[str, dict[str, Any]] | None


def frozen_store(
    script: str | Path,
    work: Path,
    *,
    freeze_when: Callable[[], bool],
    freeze_s: float,
    url_arg: str = "--checkpoint-url",
    nproc: int = 2,
    script_args: Sequence[str] = (),
    launch_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> FrozenStoreRun:
    """Run ``script`` through ``rankwise launch`` (``nproc`` ranks) with ``url_arg URL`` added
    to ``script_args``: ``s3://frozen/run`` on a SeaweedFS of its own under ``work / "s3"``,
    whose ``AWS_*`` settings reach the ranks. Once ``freeze_when()`` is true (polled every
    20 ms) the server is SIGSTOPped for ``freeze_s`` seconds; it is SIGCONTed and stopped before
    this returns, whatever happened, after reading the newest checkpoint. Raises ``subprocess.TimeoutExpired`` after ``timeout``."""
    import s3fs

    from rankwise.testing import run_script
    from rankwise.testing.s3server import S3_KEY, S3_SECRET, start_server
    from rankwise.train.checkpoint import RemoteCheckpointManager, Storage

    server = start_server(work / "s3")
    assert server.process is not None
    group = server.process.pid  # weed mini and its children: a session of their own
    store_env = {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
    }
    times = {"frozen": float("nan"), "thawed": float("nan")}
    done = threading.Event()

    def thaw() -> None:
        os.killpg(group, signal.SIGCONT)

    def watch() -> None:
        while not done.is_set():
            if freeze_when():
                os.killpg(group, signal.SIGSTOP)
                times["frozen"] = time.time()
                done.wait(freeze_s)
                thaw()
                times["thawed"] = time.time()
                return
            time.sleep(0.02)

    try:
        fs = s3fs.S3FileSystem(
            key=S3_KEY, secret=S3_SECRET, client_kwargs={"endpoint_url": server.endpoint},
            skip_instance_cache=True,
        )  # fmt: skip
        fs.mkdir(BUCKET)
        url = f"s3://{BUCKET}/run"
        watcher = threading.Thread(target=watch, name="rankwise-freezer", daemon=True)
        watcher.start()
        try:
            result = run_script(
                script,
                nproc,
                script_args=[*script_args, url_arg, url],
                launch_args=launch_args,
                timeout=timeout,
                env={**(env or {}), **store_env},
            )
        finally:
            done.set()
            watcher.join()
        thaw()
        options = {"endpoint_url": server.endpoint, "key": S3_KEY, "secret": S3_SECRET}
        latest = RemoteCheckpointManager(Storage.for_url(url, options)).load_latest()
    finally:
        thaw()
        server.stop()
    return FrozenStoreRun(
        result.returncode,
        result.stdout,
        result.stderr,
        url,
        times["frozen"],
        times["thawed"],
        latest,
    )
