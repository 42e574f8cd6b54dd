"""docs/troubleshooting.md's *you see* rows that are printed lines, not exceptions, tell the truth.

The launcher's and rank 0's lines about a lost peer, the launcher's Ctrl-C line and the
``rankwise audit`` verdict are not raised, so tests/troubleshooting/test_troubleshooting.py
cannot trigger them as rows. Here the functions that build them are called (or, for the
verdict's heading, the source is read) and each line the page quotes must be what they print,
with the numbers that vary in a run matched by any number.

In-process and fast: no launch, no ranks.
"""

from __future__ import annotations

import collections
import re
import signal
import types

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import SignalException

from helpers.paths import REPO
from helpers.troubleshooting_table import TABLE, _cells
from rankwise.distributed.signing import SignedStore
from rankwise.launch import supervisor, torchrun
from rankwise.launch.ledger import Ledger
from rankwise.train.audit import AuditReport
from rankwise.train.continuing import lost_slots


def _page() -> str:
    return TABLE.read_text()


def _quoted(prefix: str) -> list[str]:
    """Every code span that starts with ``prefix`` in the *you see* cell of the page's
    ``| you see | cause | fix |`` tables."""
    cells = [_cells(line) for line in _page().splitlines() if line.startswith("|")]
    seen = [c[0] for c in cells if len(c) == 3]
    return [m for cell in seen for m in re.findall(r"`([^`]+)`", cell) if m.startswith(prefix)]


def _any_number(text: str) -> re.Pattern[str]:
    return re.compile(r"\d+".join(re.escape(p) for p in re.split(r"\d+", text)))


def _documented(line: str) -> None:
    """The page quotes ``line``, up to the numbers in it (or a ``...`` where it stops)."""
    quoted = _quoted(line[:20])
    head = [q.split(" ...")[0] for q in quoted]
    assert any(_any_number(h).fullmatch(line[: len(h)]) or _any_number(line).fullmatch(h)
               for h in head), f"the page does not quote:\n  {line}\nit has: {quoted}"  # fmt: skip


@pytest.mark.parametrize(
    ("ledger", "slot", "code", "kwargs"),
    [
        (Ledger(slots=[0, 1, 2], restarts=3), 2, -signal.SIGKILL, {}),
        (Ledger(slots=[2], restarts=3, incarnations={2: 3}), 2, 1, {}),
        (Ledger(slots=[2], restarts=3), 2, 1, {"store_lost": True}),
        (Ledger(slots=[0, 1], restarts=3), 1, 0, {}),
        (Ledger(slots=[1], restarts=3, finished=True), 1, 1, {}),
    ],
    ids=["restarting", "no-restarts-left", "store-lost", "exit-0-early", "after-finish"],
)
def test_the_launchers_slot_lines(ledger: Ledger, slot: int, code: int, kwargs: dict) -> None:
    verdict = ledger.exited(slot, code, finished=ledger.finished, **kwargs)
    _documented(f"rankwise launch: {verdict.message}")


def test_rank_0s_peer_was_lost_line() -> None:
    store = SignedStore(dist.HashStore(), "ab" * 16, job="j1")
    store.set("member/2", "0")
    store.set("exit/2/0", "ended with signal SIGKILL")
    assert lost_slots(store, [0, 1, 2], [0, 1]) == "slot 2 (rank 2) ended with signal SIGKILL"
    source = (REPO / "src" / "rankwise" / "train" / "continuing.py").read_text()
    assert 'f"rankwise: {what}; continuing on {world} rank(s) (was {old_world}) "' in source
    assert '"from optimizer step {step}, global batch {self.global_batch} = "' in source
    _documented(
        "rankwise: a peer was lost: slot 2 (rank 2) ended with signal SIGKILL; continuing on 2 "
        "rank(s) (was 3) from optimizer step 40, global batch 48 = ..."
    )
    silent = lost_slots(store, [0, 1], [0])
    assert silent.startswith("slot 1 (rank 1) ")
    assert silent.removeprefix("slot 1 (rank 1) ") in _page()


def test_the_ctrl_c_line_under_torchrun(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: object) -> None:
        raise SignalException("interrupted", sigval=signal.SIGINT)

    monkeypatch.setattr(torchrun, "apply_defaults", lambda args: None)
    monkeypatch.setattr(torchrun, "torchrun_run", interrupted)
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    monkeypatch.setenv(torchrun.LAUNCHED_VAR, "1")
    assert torchrun.run_torchrun(types.SimpleNamespace()) == 130
    (line,) = capsys.readouterr().err.splitlines()
    _documented(line)


def test_the_ctrl_c_line_under_continue(capsys: pytest.CaptureFixture[str]) -> None:
    stop = types.SimpleNamespace(again=False)
    assert supervisor._stop_all(None, [], signal.SIGINT, stop) == 130  # no slots: no store used
    (line,) = capsys.readouterr().err.splitlines()
    _documented(line)


def test_the_audit_verdict() -> None:
    source = (REPO / "src" / "rankwise" / "train" / "audit" / "timeline.py").read_text()
    assert 'f"exactly once: VIOLATED ({scope})"' in source
    assert 'f"exactly once: ok ({scope}, each sample trained once per epoch)"' in source
    page = _page()
    assert "exactly once: VIOLATED (1000 samples x 3 epochs)" in page
    assert "exactly once: ok (" in page
    report = AuditReport(
        attempts=[],
        counts={0: collections.Counter({0: 1, 1: 2, 7: 1}), 1: collections.Counter({2: 1})},
        rolled_back=0,
        padded={0: collections.Counter({2: 2})},
        held_out=(2,),
    )
    problems = report.violations(3, 2)
    assert problems, problems
    for problem in problems:
        label = re.sub(r"^epoch \d+: (\d+ )?", "", problem).split(":")[0]
        assert label in page, (label, problem)
    cli = (REPO / "src" / "rankwise" / "cli.py").read_text()
    assert '" · exactly once: " + ("VIOLATED" if problems else "ok")' in cli
    assert "return 1 if problems else 0" in cli
