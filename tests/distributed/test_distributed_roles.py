"""The roles object (rankwise.distributed.Roles): what the checkpoint layer, resume and the
audit log ask of a process's place in a continue job, answered live from its membership. No
processes: a membership's public state, as the protocol leaves it after regroups."""

from __future__ import annotations

import types
from typing import Any

import rankwise.distributed as rd
from rankwise.distributed.config import MemberConfig


def _membership(slot: int, history: dict[int, list[int]], pending: bool = False) -> Any:
    cfg = MemberConfig(slot=slot, world_size=4, host="h", port=1, incarnation=2)
    gen = max(history)
    stopped: list[str] = []
    return types.SimpleNamespace(
        cfg=cfg, pending=pending, history=history, generation=gen, members=history[gen],
        stop=stopped.append, stopped=stopped,
    )  # fmt: skip


def test_outside_continue_mode_a_process_keeps_its_rank_and_roles() -> None:
    roles = rd.Roles(None)
    assert not roles.continuing and not roles.joining
    assert (roles.slot, roles.nnodes) == (rd.get_rank(), 1)
    assert roles.writer_now() is None and roles.member() is None
    assert not roles.writer_left_out((0, 0))
    roles.stop_joiners("nothing to stop")  # no membership: nothing happens


def test_the_writer_of_a_save_counts_as_lost_once_a_later_generation_left_it_out() -> None:
    history = {0: [0, 1, 2], 1: [0, 1, 2]}
    m = _membership(1, history)
    roles = rd.Roles(m)
    started = roles.writer_now()
    assert started == (1, 0)  # generation 1, slot 0 writes
    assert roles.member() == (1, 2, 1)
    assert not roles.writer_left_out(started)
    history[2] = [1, 2]  # slot 0 lost: generation 2 left it out
    m.generation, m.members = 2, history[2]
    assert roles.writer_left_out(started)  # answered live: the same object, a later generation
    assert roles.writer_now() == (2, 1)
    assert not roles.writer_left_out(roles.writer_now())
    history[3] = [0, 1, 2]  # slot 0 back (a restart): its old write is still the lost one's
    m.generation = 3
    assert roles.writer_left_out(started)


def test_a_joiner_resumes_nothing_and_stops_nobody() -> None:
    m = _membership(3, {0: [3]}, pending=True)
    roles = rd.Roles(m)
    assert roles.continuing and roles.joining and roles.slot == 3
    roles.stop_joiners("a write failed")
    assert m.stopped == []  # a rank asking to join gives up itself, it stops no one
    m.pending = False
    roles.stop_joiners("a write failed")
    assert m.stopped == ["a write failed"]
