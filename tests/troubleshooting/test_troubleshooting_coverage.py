"""docs/troubleshooting.md misses nothing silently: every message rankwise raises or warns is in
its table, or listed here with the reason it is not.

tests/troubleshooting/test_troubleshooting.py checks that each row's error is raised as written; this is the
reverse check. Every ``SomeError("...")`` / ``SomeError(f"...")`` call (raised, or returned by a
helper that builds the error) and every ``warnings.warn("...")`` in src/rankwise is read with
``ast`` into a template: its literal text, with ``{}`` for each formatted part. A template is
covered when a row's message matches it (each ``{}`` matching any text; messages that wrap
another, such as ``cannot resume: ...``, cover the wrapped one too). Otherwise it must be in
:data:`INTERNAL` (an invariant a user cannot reach through the public API) or
:data:`NOT_YET_ROWS` (user-facing, the message names the value and the fix, but no row yet: the
backlog), each entry with a one-line reason. A new message that is in none of them fails the
test, and so does an entry that no longer matches a message or that a row now covers.

Pure Python: no processes, nothing imported from rankwise.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from helpers.paths import REPO
from helpers.troubleshooting_table import rows

ROOT = REPO
SRC = ROOT / "src" / "rankwise"

# A template with less literal text than this says too little to match a row by (e.g. "{}").
MIN_LITERAL = 12

# -- the allow-lists: (file under src/rankwise, text the template contains) -> reason ------------

_INVARIANT = "an internal invariant: the public API never lets it fail"
_WRAPPER = "re-raises another error's message with a prefix; the wrapped message is the one to list"
_TESTING = "rankwise.testing reports a test's failure, not a user's"
_GUARD = "guards a private helper's arguments, which rankwise's own callers always pass valid"

INTERNAL: dict[tuple[str, str], str] = {
    ("data/range_source.py", "rows must be sorted, unique and in [0, "): _GUARD,
    ("storage/store.py", "into holds {} bytes; the ranges hold {}."): (
        "a caller's buffer of the wrong size (FetchDataset's sources size it from the same "
        "ranges; test_a_read_into_a_buffer_refuses_a_wrong_size_... triggers it)"
    ),
    ("testing/store_attacks.py", "a get of the missing key {} waits for the timeout"): (
        "VanishingStore's, a test store's: a reader under test that does a get it must not "
        "(the readers' tests assert it never happens)"
    ),
    ("testing/store_attacks.py", "{} was not set within {} s"): (
        "await_value's, a test helper's: the test that polls names what it waited for"
    ),
    ("distributed/membership.py", "could not give the gloo group its collective timeout"): (
        "a torch whose gloo backend no longer takes _set_default_timeout; the pinned torch "
        "does (test_a_group_gets_the_collective_timeout_once_it_stands checks it took)"
    ),
    ("data/prefetch.py", "must be >= 0 (0: no read-ahead)"): (
        "FetchDataset checks prefetch_bytes first (row fetch-prefetch-negative)"
    ),
    ("storage/ranges.py", "must be >= 0 bytes."): _GUARD,
    ("data/cache.py", "must be >= 0 (0: no cache)."): (
        "FetchDataset checks cache_bytes first (check_int), so the cache never sees a negative"
    ),
    ("data/fetch_plan.py", "batches consumed, but the workers hold only"): _INVARIANT,
    ("train/state.py", "broadcast_state in a world of one needs the state"): _INVARIANT,
    ("parallel/hooks.py", "powersgd_hook needs HookState.powersgd"): _INVARIANT,
    ("train/config/training.py", "{} (config file {})"): _WRAPPER,
    ("train/trainer.py", "set-up of the checkpoints in {} failed"): (
        "a follower's stand-in for the error another rank prints in full; under rankwise "
        "launch it prints as one line pointing there"
    ),
    ("train/trainer.py", "failed its check on rank {}"): (
        "a follower's stand-in for the StorageError another rank prints in full (its row: "
        "storage-missing-bucket and the other storage rows); under rankwise launch it prints "
        "as one line pointing there"
    ),
    ("train/checkpoint/files.py", "{} verifies but does not load: {}"): _WRAPPER,
    ("distributed/environment.py", "{}. Start the script with `srun python"): _WRAPPER,
    ("testing/__init__.py", "world_size ({}) must be >= 1."): _TESTING,
    ("testing/__init__.py", "rank {} of {} failed{}:"): _TESTING,
    ("testing/__init__.py", "did not finish within {} s"): _TESTING,
    ("testing/faults.py", "is not a checkpoint fault point"): _TESTING,
    ("testing/faults.py", "after ({}) must be an integer >= 0."): _TESTING,
    ("testing/tamper.py", "is not a tamper; use one of"): _TESTING,
    ("testing/tamper.py", "applies to sharded (.dcp) checkpoints only"): _TESTING,
    ("testing/tamper.py", "plants a pickle payload: pass marker"): _TESTING,
    ("testing/tamper.py", "is not named ...-s<step>.pt/.dcp; nothing to rename."): _TESTING,
    ("train/checkpoint/manifests.py", "no checkpoint key: set checkpoint_key or {}."): _GUARD,
    ("train/checkpoint/sharded.py", "checkpoint {}: DCP asked for a per-rank index."): (_INVARIANT),
    ("__init__.py", "module 'rankwise' has no attribute {}"): "Python's own AttributeError text",
    ("compat/tensorbrain/alias.py", "has no attribute {}: it is an alias"): "Python's own text",
    ("train/state.py", "the training state has no optimizer yet"): (
        "the trainer refuses first with 'the trainer is not set up yet' (row trainer-not-set-up)"
    ),
    ("train/checkpoint/files.py", "{} holds a {}, not a dict."): (
        "save_file writes dicts only, and a file without its manifest fails verification first"
    ),
    ("distributed/rendezvous.py", "no live store at {}"): (
        "the cause quoted inside the master-unreachable error, never raised on its own"
    ),
    ("launch/jobstore.py", "nothing answered within {} s: {}"): (
        "the cause quoted inside the launcher's `cannot reach the membership store` line "
        "(row continue-store-wait's fix), never shown on its own"
    ),
}

# The backlog: user-facing, each names the value and the fix, but no row documents it yet,
# because no trigger can provoke it portably and fast (below: the reason for each). Moving an
# entry into the table means a row, a trigger, and deleting it.
_MID_INIT = (
    "fires only when a peer crashes or stalls at a precise moment inside init() (rank 0 exiting "
    "while it hosts the store, a rank stuck between building the group and the final check, "
    "torchrun's store without rank 0's announcement): no fast, deterministic trigger"
)
_CONTINUE = (
    "fires only inside a job under `rankwise launch --on-failure continue`, after a rank was "
    "lost or restarted (docs/continue.md lists it): a trigger needs a launch and a kill"
)
_FORGED = (
    "fires only for a sharded checkpoint folder whose manifest was rewritten by hand to match "
    "changed files (a torn or changed file fails verification first): a trigger must forge one"
)
_NEEDS_GPU = "fires only on machines with(out) CUDA, so a trigger here cannot be portable"

_STORAGE_API = (
    "the object-storage layer's own API (Storage, RetryPolicy, Catalogue), which fit "
    "calls with valid arguments; the message names the value and the rule"
)
_RACE = (
    "fires only when an object changes or vanishes between two calls (another writer, a "
    "lifecycle rule): no fast, deterministic trigger"
)
INTERNAL.update(
    {
        ("testing/s3server.py", "no pair of free ports (p, p + 10000)"): _TESTING,
        ("testing/s3server.py", "no free port found on 127.0.0.1"): _TESTING,
        ("testing/s3server.py", "is not an S3 bucket name (3-63 lowercase"): _TESTING,
        ("testing/s3server.py", "the server counts per bucket, not per key"): _TESTING,
        ("testing/s3server.py", "SeaweedFS's metrics at {} did not answer"): _TESTING,
        (
            "train/tracking/tracker_set.py",
            "rank 0 sent tracker run ids that are not names and ids",
        ): (_INVARIANT),
        ("testing/s3server.py", "binary was not found; the object-storage tests"): _TESTING,
        ("testing/servers.py", "did not answer within {} s; log"): _TESTING,
        ("testing/servers.py", "exited with {} before {} answered; log"): _TESTING,
        ("testing/servers.py", "attempts must be >= 1"): _TESTING,
        ("storage/retry.py", "unreachable"): _INVARIANT,
        ("train/checkpoint/catalogue.py", "is not a checkpoint name of prefix"): _STORAGE_API,
        ("train/checkpoint/manager.py", "is a local folder: use CheckpointManager"): _STORAGE_API,
        ("train/checkpoint/sharded.py", "could not write its part of {}: {}"): _WRAPPER,
        ("storage/store.py", "part_size ({}) must be >= 5 MiB"): _STORAGE_API,
        ("storage/store.py", "is remote storage; it has no local path."): _STORAGE_API,
        ("storage/retry.py", "attempts ({}) must be an integer >= 1."): (_STORAGE_API),
        ("storage/retry.py", "attempts ({}) must be >= 1 (1: no retry)."): (_STORAGE_API),
        ("storage/retry.py", "first_delay ({}) and max_delay ({}) must"): (_STORAGE_API),
    }
)

_RARE_FILE = (
    "names the file and the fix; a file written by numpy, h5py or anndata never has it, so a "
    "row needs a hand-made broken file"
)
NOT_YET_ROWS: dict[tuple[str, str], str] = {
    ("data/source_layout.py", "is not a readable .npy file"): _RARE_FILE,
    ("data/source_layout.py", "FetchDataset reads numeric arrays with rows along axis 0"): (
        "names the dtype, the shape and the rule (an object or 0-d .npy); no row yet"
    ),
    ("data/source_layout.py", "is truncated: its header says"): _RARE_FILE,
    ("data/table_source.py", "its Parquet footer cannot be read"): _RARE_FILE,
    ("data/sources.py", "is an empty list of files"): (
        "only open_source([]) reaches it: FetchDataset([]) is an empty in-memory source"
    ),
    ("data/source_layout.py", "that split its rows"): (
        "names the chunks and the fix; h5py and anndata chunk along axis 0 unless told otherwise"
    ),
    ("data/source_layout.py", "has chunks never written (unallocated)"): _RARE_FILE,
    ("data/source_layout.py", "has no data written (unallocated)"): _RARE_FILE,
    ("data/sources.py", "has no X matrix; read a layer with an h5py source"): (
        "names the fix; the in-memory twin is row fetch-anndata-no-x"
    ),
    ("storage/store.py", "the object is shorter than its header says"): _RACE,
    ("train/audit/timeline.py", "rankwise audit --plot needs matplotlib"): (
        "names its fix (the demo extra); a row needs a run without matplotlib, which the test "
        "environment installs"
    ),
    ("train/checkpoint/backends.py", "changed while it was uploaded to"): _RACE,
    ("train/checkpoint/backends.py", "is missing; its manifest remains."): _RACE,
    ("storage/store.py", "read back other bytes than were written."): _RACE,
    ("storage/store.py", "use a local path or an fsspec URL (s3://, gs://"): (
        "fires for a URL scheme fsspec does not know; its text is fsspec's, which varies by "
        "fsspec version"
    ),
    ("distributed/membership.py", "was refused by the running job: its proof"): _CONTINUE,
    (
        "distributed/group.py",
        "backend 'nccl' needs CUDA GPUs and NCCL, and this machin",
    ): _NEEDS_GPU,
    (
        "distributed/group.py",
        "local_rank ({}) is beyond the {} visible CUDA device(s):",
    ): _NEEDS_GPU,
    (
        "distributed/group.py",
        "this build of torch has no gloo backend (DISTRIBUTED_BAC",
    ): _NEEDS_GPU,
    (
        "distributed/rendezvous.py",
        "rank {} timed out after {} s waiting for rank 0 to annou",
    ): _MID_INIT,
    (
        "distributed/rendezvous.py",
        "rank {} built its process group, but after another {} s",
    ): _MID_INIT,
    (
        "distributed/rendezvous.py",
        "rank {} lost the rendezvous store during init(): rank 0,",
    ): _MID_INIT,
    (
        "train/checkpoint/portable.py",
        "the RNG state holds {} CUDA generators and this process",
    ): _NEEDS_GPU,
    (
        "train/checkpoint/sharded.py",
        "{}: its manifest lists no {} (a sharded checkpoint's",
    ): _FORGED,
    ("train/checkpoint/sharded.py", "checkpoint {}: the state names no verified {}; load i"): (
        "fires only for load_shards given a state made by hand, not by read_checkpoint: "
        "no trigger a user meets"
    ),
    (
        "distributed/membership.py",
        "slot {} (restart {}) waited {}s and no running rank let",
    ): _CONTINUE,
    (
        "distributed/membership.py",
        "slot {} was left out of generation {} (members {}): it d",
    ): _CONTINUE,
    ("train/continuing.py", "the survivors stopped at optimizer steps {} after {}: mo"): _CONTINUE,
    ("train/closings.py", "the survivors of a regroup stopped in places that no lo"): _CONTINUE,
    (
        "distributed/membership.py",
        "slot {} (restart {}) cannot join: every rank of generati",
    ): _CONTINUE,
    ("train/continuing.py", "--on-failure continue re-splits the rest of the epoch ov"): _CONTINUE,
    ("distributed/membership.py", "slot {} (restart {}) will not join: the running ranks"): (
        _CONTINUE
    ),
    ("distributed/membership.py", "slot {}, let into generation {}, died or stalled before"): (
        _CONTINUE
    ),
    ("distributed/membership.py", "generation {}'s group (slots {}) did not form within {}"): (
        _CONTINUE
    ),
    ("distributed/membership.py", "generation {}'s group (slots {}) did not form twice, w"): (
        _CONTINUE
    ),
    ("train/checkpoint/placement.py", "checkpoint_dir ({}) is relative, and this --on-failure"): (
        "fires only inside a continue job launched on more than one node (--nnodes > 1): "
        "tests/train/checkpoint/test_checkpoint_writer_roles.py triggers it"
    ),
    ("train/continuing.py", "{} recoveries in a row at optimizer step {} without a step"): (
        _CONTINUE
    ),
    ("train/checkpoint/sharded.py", "checkpoint {}: {} is not a rankwise training state."): _FORGED,
    ("train/checkpoint/sharded.py", "checkpoint {}: {} verifies but does not load: {}"): _FORGED,
}


# -- reading the sources ---------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    path: str  # under src/rankwise
    line: int
    kind: str  # the exception or warning class as written
    template: str  # literal text, "{}" for each formatted part

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.kind}: {self.template!r}"


def _template(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{}") + (right if right is not None else "{}")
    return None


def _is_error_class(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return re.search(r"(Error|Exception|Warning)$", name) is not None


def _is_warn(func: ast.expr) -> bool:
    return ast.unparse(func) in ("warnings.warn", "warn")


def _warning_kind(call: ast.Call) -> str:
    if len(call.args) > 1:
        return ast.unparse(call.args[1])
    category = [k.value for k in call.keywords if k.arg == "category"]
    return ast.unparse(category[0]) if category else "UserWarning"


def sites() -> list[Site]:
    """Every error or warning rankwise builds with a message written at the call."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            if _is_warn(node.func):
                kind = _warning_kind(node)
            elif _is_error_class(node.func):
                kind = ast.unparse(node.func)
            else:
                continue
            template = _template(node.args[0])
            if template is not None:
                rel = path.relative_to(SRC).as_posix()
                found.append(Site(rel, node.lineno, kind, template))
    return found


def row_messages() -> dict[str, str]:
    """``id -> message`` of the page's rows (read as tests/troubleshooting/test_troubleshooting.py reads them)."""
    return {row: message for row, (_, message) in rows().items()}


def _regex(template: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in template.split("{}")), re.DOTALL)


def covering_row(site: Site, rows: dict[str, str]) -> str | None:
    if len(site.template.replace("{}", "")) < MIN_LITERAL:
        return None
    pattern = _regex(site.template)
    return next((row for row, message in rows.items() if pattern.search(message)), None)


def _listed(site: Site) -> list[tuple[str, str]]:
    return [
        key for key in (*INTERNAL, *NOT_YET_ROWS) if key[0] == site.path and key[1] in site.template
    ]


# -- the checks ------------------------------------------------------------------------------


def test_the_scan_finds_the_messages_it_should() -> None:
    """The scanner itself: it sees raises, returned errors, warnings and f-string parts."""
    found = sites()
    assert len(found) >= 250, len(found)
    templates = {(s.path, s.template) for s in found}
    # a plain raise with an f-string
    assert ("train/checkpoint/files.py", "save_file takes a dict, got {}.") in templates
    # an error a helper builds and returns (environment.py's _bad_nodelist)
    assert any(s.path == "distributed/environment.py" and "SLURM host list" in s.template
               for s in found)  # fmt: skip
    # a warning, with its category
    assert any(
        s.kind == "CheckpointWarning" and s.path == "train/checkpoint/writer.py" for s in found
    )
    # a message concatenated from a literal and an expression
    assert any(s.template.startswith("{} Skipping it and trying") for s in found)


def test_every_message_is_in_the_table_or_listed_with_a_reason() -> None:
    rows = row_messages()
    unlisted = [s for s in sites() if covering_row(s, rows) is None and not _listed(s)]
    assert not unlisted, (
        "messages neither in docs/troubleshooting.md's table nor in this test's INTERNAL / "
        "NOT_YET_ROWS (add a row with a trigger in tests/test_troubleshooting*.py, or list it "
        "with a reason):\n" + "\n".join(map(str, unlisted))
    )


def test_no_listed_message_is_covered_by_a_row_or_gone() -> None:
    rows = row_messages()
    found = sites()
    stale = [k for k in (*INTERNAL, *NOT_YET_ROWS) if not any(k in _listed(s) for s in found)]
    assert not stale, f"allow-list entries that match no message any more: {stale}"
    covered = [
        (str(s), row) for s in found if _listed(s) and (row := covering_row(s, rows)) is not None
    ]
    assert not covered, f"listed, yet a row covers them (drop them from the lists): {covered}"
    assert all(reason.strip() for reason in (*INTERNAL.values(), *NOT_YET_ROWS.values()))
    assert not set(INTERNAL) & set(NOT_YET_ROWS)
