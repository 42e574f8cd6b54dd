"""The continue launcher's decision on every exit and its exit code (issue 30, 1), as the pure
function the supervising loop carries out (``rankwise.launch.supervisor.Ledger``), fed exit
sequences: the issue's two findings, then every sequence hypothesis draws of up to 3 slots,
0-2 restarts, exits 0 / 1 / SIGKILL in any order, training finishing at any point (or never),
processes the launcher ended itself. The one real launch of the finding is
tests/train/test_train_continue_failures.py::test_an_early_exit_0_is_restarted_and_the_job_ends_0_only_once_training_finished.

The contract (docs/continue.md, "When the job is done"): the exit code is 0 only if training
finished (a rank recorded that its fit completed) and nothing failed after; before that every
exit, 0 included, of a slot with restarts left is restarted; every failed exit is named."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.launch.ledger import Ledger

SIGKILL = -9


def test_an_early_exit_0_does_not_switch_restarts_off() -> None:
    # 2 ranks, --max-restarts 2: slot 1 exits 0 in step 3, slot 0 raises in step 6. Main: the
    # launcher took the exit 0 for the job's end, restarted nobody and exited 0.
    ledger = Ledger([0, 1], restarts=2)
    early = ledger.exited(1, 0, finished=False)
    assert early.action == "restart" and "slot 1 exited with exit code 0 before training" in (
        early.message or ""
    )
    raised = ledger.exited(0, 1, finished=False)
    assert raised.action == "restart" and "slot 0 exited with exit code 1" in (raised.message or "")
    assert ledger.code() == 1  # were nothing more to come: not finished, not 0
    assert ledger.exited(1, 0, finished=True).action == "done"  # slot 1's restart finished
    assert ledger.exited(0, SIGKILL, finished=True, ended=True).action == "ended"  # a joiner
    assert ledger.code() == 0


def test_with_3_ranks_a_failed_slot_with_restarts_left_is_restarted_and_named() -> None:
    ledger = Ledger([0, 1, 2], restarts=1)
    ledger.exited(2, 0, finished=False)
    verdict = ledger.exited(1, 1, finished=False)
    assert verdict.action == "restart" and "slot 1 exited with exit code 1" in (
        verdict.message or ""
    )


def test_a_failure_after_training_finished_is_named_and_fails_the_job() -> None:
    ledger = Ledger([0, 1], restarts=2)
    assert ledger.exited(1, 0, finished=True).action == "done"
    verdict = ledger.exited(0, 3, finished=True)
    assert verdict.action == "failed" and "slot 0 exited with exit code 3 after training" in (
        verdict.message or ""
    )
    assert ledger.code() == 3


@dataclass(frozen=True)
class Exit:
    pick: int  # which running process exits (an index into the running ones)
    code: int
    finished_before: bool  # training finished (a rank recorded it) before this exit
    ended: bool  # the launcher ended this process itself


exits = st.builds(
    Exit,
    pick=st.integers(0, 5),
    code=st.sampled_from([0, 1, SIGKILL]),
    finished_before=st.booleans(),
    ended=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    nproc=st.integers(1, 3),
    restarts=st.integers(0, 2),
    sequence=st.lists(exits, max_size=12),
    store_lost_from=st.one_of(st.none(), st.integers(0, 12)),
)
def test_every_exit_sequence_keeps_the_contract(nproc, restarts, sequence, store_lost_from):
    ledger = Ledger(list(range(nproc)), restarts)
    running = list(range(nproc))  # slots with a live process
    started = dict.fromkeys(running, 0)  # restarts so far, counted here independently
    finished = False  # training finished: once true, stays true
    failed_after = False
    for i, exit in enumerate(sequence):
        if not running:
            break
        slot = running[exit.pick % len(running)]
        finished = finished or exit.finished_before
        lost = store_lost_from is not None and i >= store_lost_from
        verdict = ledger.exited(
            slot, exit.code, finished=finished, store_lost=lost, ended=exit.ended
        )
        failed = exit.code != 0 or not finished
        if finished:
            # After the end: an exit 0 is done; a failure is the job's, unless it was ended.
            want = "done" if exit.code == 0 else "ended" if exit.ended else "failed"
            failed_after = failed_after or want == "failed"
        else:
            want = "restart" if started[slot] < restarts and not lost else "lost"
        assert verdict.action == want, (verdict, exit, started[slot])
        named = verdict.message is not None and f"slot {slot} exited with" in verdict.message
        assert named == (failed and want != "ended"), verdict  # every failed exit is named
        if want == "restart":
            started[slot] += 1
            assert f"({started[slot]}/{restarts})" in (verdict.message or "")
        else:
            running.remove(slot)
    assert all(n <= restarts for n in ledger.incarnations.values())
    assert ledger.incarnations == started
    code = ledger.code()
    if not finished or failed_after:
        assert code != 0  # a job whose training did not finish never exits 0
    else:
        assert code == 0
