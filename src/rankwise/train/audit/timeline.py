"""A run through its faults, read back from its :class:`~rankwise.train.audit.log.AuditLog`
folder: who trained which optimizer step when, who was lost, where the world regrouped and
who rejoined. ``rankwise audit DIR`` prints :func:`summary`; ``--plot`` draws :func:`plot`.

Each rank's file of each attempt is one *lane*: a process (``pid``) training in one world
between its first and its last record. Lanes sit on rows by ``slot`` (a process's rank in the
launched world, which the records of ``--on-failure continue`` carry: a row is one slot through
its regroups and restarts), else by rank. Between two attempts a slot that is not in the
next one was *lost* at its last record; one that comes back is a *rejoin*; a world whose every
process is new is a *restart* (``--on-failure restart``, from a checkpoint).

>>> import json, tempfile
>>> from pathlib import Path
>>> folder = Path(tempfile.mkdtemp())
>>> def write(attempt, rank, slot, start, steps, t0, world):
...     head = {"start_step": start, "rank": rank, "world_size": world, "time": t0,
...             "pid": 100 + slot, "slot": slot, "incarnation": 0, "generation": int(attempt)}
...     rows = [head] + [{"epoch": 0, "step": s, "ids": [s], "time": t0 + s} for s in steps]
...     rows += [{"end_step": 4, "time": t0 + 5}] if attempt == "1" else []  # fit's end
...     text = "".join(json.dumps(r) + "\\n" for r in rows)
...     (folder / f"audit-{attempt}-rank{rank}.jsonl").write_text(text)
>>> for slot in (0, 1):  # slot 1 is lost in step 3; slot 0 goes on alone from step 2
...     write("0", slot, slot, 0, range(1, 4), 0.0, 2)
>>> write("1", 0, 0, 2, range(3, 5), 10.0, 1)
>>> line = read_timeline(folder)
>>> [(t.kind, t.lost, t.step, t.before, t.after) for t in line.transitions]
[('regroup', [1], 2, 2, 1)]
>>> [(lane.row, lane.last_step) for lane in line.lost]
[(1, 3)]
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwise.train.audit.log import AuditReport, commit_limits, read_audit_files

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Lane", "Timeline", "Transition", "figure", "plot", "read_timeline", "summary"]


@dataclass
class Lane:
    """One rank's records in one attempt (one file): a process training in one world."""

    attempt: int  # index of the attempt, in the order they started
    start_step: int  # the optimizer step the attempt started after
    rank: int
    slot: int | None  # None: records written outside continue mode (or before it recorded it)
    incarnation: int | None
    pid: int | None
    start: float  # wall time of the attempt's first line here
    end: float  # wall time of the last record
    finished: bool  # wrote the end of fit
    steps: dict[int, float] = field(default_factory=dict)  # step -> its first micro-batch here
    epochs: dict[int, int] = field(default_factory=dict)  # step -> epoch
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (step, time saved)

    @property
    def row(self) -> int:
        return self.rank if self.slot is None else self.slot

    @property
    def last_step(self) -> int | None:
        return max(self.steps, default=None)


@dataclass
class Transition:
    """From one attempt to the next: ``kind`` is ``"regroup"`` (someone lost), ``"rejoin"``
    (someone came back), or ``"restart"`` (every process new: a relaunch from a checkpoint)."""

    kind: str
    time: float  # the next attempt's first line
    step: int  # the optimizer step the next attempt starts after
    before: int  # world sizes
    after: int
    lost: list[int]  # rows (slots, else ranks)
    joined: list[int]

    @property
    def label(self) -> str:
        worlds = f"{self.before} → {self.after} ranks from step {self.step}"
        if self.kind == "restart":
            return f"restart\n{worlds}"
        who = []
        if self.lost:
            who.append(f"{_rows(self.lost)} lost")
        if self.joined:
            who.append(f"{_rows(self.joined)} back")
        return f"{self.kind}: {', '.join(who)}\n{worlds}" if who else f"{self.kind}\n{worlds}"


@dataclass
class Timeline:
    """Every lane, the transitions between attempts, and the lanes whose process was lost."""

    lanes: list[Lane]
    attempts: list[tuple[str, int, int]]  # (name, start step, world size), in order
    transitions: list[Transition]
    lost: list[Lane]
    by_slot: bool  # rows are slots (else ranks)

    @property
    def t0(self) -> float:
        return min((lane.start for lane in self.lanes), default=0.0)

    @property
    def rows(self) -> list[int]:
        return sorted({lane.row for lane in self.lanes})

    @property
    def checkpoints(self) -> dict[int, float]:
        """Step held -> when it was taken: as the next step began (its first micro-batch
        anywhere), else when recorded. Only a rank that wrote a checkpoint records it, once
        its write landed (a background write is known at the next save, the end of fit, or
        a drain on an exception or SIGTERM); a write that never landed is not listed."""
        taken: dict[int, float] = {}
        for lane in self.lanes:
            for step, when in lane.checkpoints:
                taken[step] = min(when, taken.get(step, when))
        for lane in self.lanes:
            for step in taken:
                if step + 1 in lane.steps:
                    taken[step] = min(taken[step], lane.steps[step + 1])
        return dict(sorted(taken.items()))

    def rolled_back(self, lane: Lane) -> set[int]:
        """Steps of ``lane`` a later attempt went back past (trained again after it)."""
        limit = commit_limits([start for _, start, _ in self.attempts])[lane.attempt]
        return set() if limit is None else {s for s in lane.steps if s > limit}


def read_timeline(directory: str | os.PathLike[str]) -> Timeline:
    """The lanes and transitions of an :class:`~rankwise.train.audit.log.AuditLog` folder."""
    files = read_audit_files(directory)
    names = sorted({name for name, _ in files})
    lanes = [_lane(names.index(name), records) for name, records in files]
    by_slot = bool(lanes) and all(lane.slot is not None for lane in lanes)
    if not by_slot:  # mixed or old records: rows are ranks, and ranks do not follow a process
        for lane in lanes:
            lane.slot = None
    per_attempt = [[lane for lane in lanes if lane.attempt == i] for i in range(len(names))]
    attempts = [
        (name, group[0].start_step, len(group))
        for name, group in zip(names, per_attempt, strict=True)
    ]
    transitions, lost = [], []
    for before, after in itertools.pairwise(per_attempt):
        transitions.append(_transition(before, after, by_slot))
        gone = set(transitions[-1].lost)
        lost += [lane for lane in before if lane.row in gone]
    if per_attempt:  # the last attempt: a process that never reached the end of fit
        lost += [lane for lane in per_attempt[-1] if not lane.finished]
    return Timeline(lanes, attempts, transitions, lost, by_slot)


def _lane(attempt: int, records: list[dict[str, Any]]) -> Lane:
    head = records[0]
    lane = Lane(
        attempt=attempt,
        start_step=int(head["start_step"]),
        rank=int(head["rank"]),
        slot=head.get("slot"),
        incarnation=head.get("incarnation"),
        pid=head.get("pid"),
        start=float(head["time"]),
        end=float(records[-1]["time"]),
        finished=False,
    )
    for record in records[1:]:
        if "ids" in record:
            lane.steps.setdefault(record["step"], float(record["time"]))
            lane.epochs.setdefault(record["step"], record["epoch"])
        elif "checkpoint_step" in record:
            lane.checkpoints.append((record["checkpoint_step"], float(record["time"])))
        elif "end_step" in record:
            lane.finished = True
    return lane


def _transition(before: list[Lane], after: list[Lane], by_slot: bool) -> Transition:
    old = {lane.row: lane for lane in before}
    new = {lane.row: lane for lane in after}
    lost = sorted(set(old) - set(new)) if by_slot else []
    joined = sorted(set(new) - set(old)) if by_slot else []
    pids_old = {lane.pid for lane in before}
    every_process_new = (
        all(lane.pid is not None and lane.pid not in pids_old for lane in after)
        and None not in pids_old
    )
    if by_slot:
        # A slot back under a new pid joined too (it was lost and restarted in between).
        joined += sorted(r for r in set(new) & set(old) if new[r].pid != old[r].pid)
    if every_process_new and by_slot:  # a relaunch (maybe on fewer or more ranks)
        kind = "restart"
        lost, joined = [], []
    elif lost:
        kind = "regroup"
    elif joined and not every_process_new:
        kind = "rejoin"
    elif every_process_new or len(after) == len(before):
        kind = "restart"
        lost, joined = [], []
    else:  # records without slots: the world size says which way it went
        kind = "regroup" if len(after) < len(before) else "rejoin"
    return Transition(
        kind=kind,
        time=min(lane.start for lane in after),
        step=after[0].start_step,
        before=len(before),
        after=len(after),
        lost=lost,
        joined=sorted(set(joined)),
    )


def _rows(rows: list[int], word: str = "slot") -> str:
    return f"{word}{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}"


# -- the summary ---------------------------------------------------------------------------


def summary(
    line: Timeline,
    report: AuditReport,
    num_samples: int | None = None,
    epochs: int | None = None,
) -> tuple[list[str], list[str]]:
    """The lines ``rankwise audit`` prints, and the exactly-once violations (empty: none),
    checked when the records say the data set's size (``data_size``) or ``num_samples`` is
    given (it overrides the records' size; ``epochs`` their epochs)."""
    if not line.lanes:
        return ["no audit records (audit-*-rank*.jsonl) here"], []
    word = "slot" if line.by_slot else "rank"
    steps = sorted({s for lane in line.lanes for s in lane.steps})
    saved = list(line.checkpoints)
    pids = {(lane.row, lane.pid) for lane in line.lanes if lane.pid is not None}
    span = max(lane.end for lane in line.lanes) - line.t0
    kinds = [t.kind for t in line.transitions]
    out = [
        f"{len(line.attempts)} attempt(s), {len(line.rows)} {word}s "
        f"({', '.join(map(str, line.rows))})"
        + (f", {len(pids)} processes" if pids else "")
        + f", {span:.1f} s of records",
        f"steps: {steps[0] if steps else 0}..{steps[-1] if steps else 0} "
        f"({report.rolled_back} micro-batch(es) rolled back and trained again)",
        f"lost: {len(line.lost)}, regroups: {kinds.count('regroup')}, "
        f"rejoins: {kinds.count('rejoin')}, restarts: {kinds.count('restart')}",
        f"checkpoints saved: {len(saved)}" + (f" (steps {_steps(saved)})" if saved else ""),
        "",
    ]
    for i, (name, start, world) in enumerate(line.attempts):
        rows = sorted(lane.row for lane in line.lanes if lane.attempt == i)
        how = "" if i == 0 else f"  <- {line.transitions[i - 1].label.replace(chr(10), '; ')}"
        out.append(
            f"  attempt {i} ({name}): {world} rank(s), {word}s {rows}, from step {start}{how}"
        )
    for lane in line.lost:
        out.append(f"  {word} {lane.row} (pid {lane.pid}) lost after step {lane.last_step}")
    problems: list[str] = []
    size = num_samples if num_samples is not None else report.data_size
    if size is not None:
        problems = report.violations(size, epochs)
        epochs = epochs if epochs is not None else report.epochs
        held = f", {len(report.held_out)} held out" if report.held_out else ""
        scope = f"{size} samples{held}" + (f" x {epochs} epochs" if epochs is not None else "")
        out.append("")
        if problems:
            out += [f"exactly once: VIOLATED ({scope})", *(f"  {p}" for p in problems)]
        else:
            out.append(f"exactly once: ok ({scope}, each sample trained once per epoch)")
    return out, problems


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:12])) + (" ..." if len(steps) > 12 else "")


# -- the picture ---------------------------------------------------------------------------

_TICK, _ROLLED, _LOST, _REGROUP, _REJOIN, _RESTART, _SAVED = (
    "#1f4e79", "#b0b0b0", "#d62728", "#e08214", "#2ca02c", "#7f3b08", "#7b3294"
)  # fmt: skip
_BETWEEN = "#555555"
_BARS = ("#cfe2f3", "#fde0c5", "#d9f0d3", "#e7d4e8", "#fff2ae", "#d0d0d0")  # one per attempt


_BEHIND = {"facecolor": "white", "edgecolor": "none", "alpha": 0.75, "pad": 0.5}  # a label's ground
_LEVEL_PT = 22  # the height of a two-line transition label, in points
_MAX_LEVELS = 4  # rows of transition labels at most (more faults: those that fit)


def plot(line: Timeline, path: str | os.PathLike[str], title: str = "") -> Path:
    """Draw ``line`` to a PNG (:func:`figure`); returns the path.

    Needs matplotlib (``pip install "rankwise[demo]"``); uses its Agg canvas (no pyplot)."""
    out = Path(path)
    drawn = figure(line, title)
    out.parent.mkdir(parents=True, exist_ok=True)
    drawn.savefig(out, format="png")
    return out


def figure(line: Timeline, title: str = "") -> Figure:
    """The picture :func:`plot` saves: a row per slot (else rank), wall time across; a tick
    per optimizer step, the losses, regroups, rejoins and checkpoints marked. No two labels
    overlap: the transitions' labels take up to four rows above the run, the others move or
    are left out where they would cover one already placed (the summary names them all)."""
    try:
        import matplotlib.figure  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise ImportError(
            'rankwise audit --plot needs matplotlib: pip install "rankwise[demo]" '
            "(or pip install matplotlib)."
        ) from exc
    levels = min(len(line.transitions), _MAX_LEVELS)
    drawn, used = _draw(line, title, levels)
    if used < levels:  # fewer rows of labels were needed: no empty band
        drawn, used = _draw(line, title, used)
    assert isinstance(drawn.canvas, FigureCanvasAgg)
    return drawn


def _draw(line: Timeline, title: str, levels: int) -> tuple[Figure, int]:
    """The figure with ``levels`` rows for the transitions' labels, its labels laid out; and
    how many of those rows the labels took."""
    from matplotlib.artist import Artist
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = line.rows
    band = 0.1 + levels * _LEVEL_PT / 72  # inches for the transitions' labels
    height = 1.9 + 0.55 * len(rows) + band
    drawn = Figure(figsize=(10, height), dpi=90, layout="constrained")
    FigureCanvasAgg(drawn)
    if levels:
        top, axes = drawn.subplots(
            2, 1, sharex=True, height_ratios=[band, height - band - 1.2],
            gridspec_kw={"hspace": 0},
        )  # fmt: skip
        top.set_axis_off()
    else:
        axes = drawn.subplots()
        top = None
    y = {row: i for i, row in enumerate(rows)}
    t0 = line.t0
    for lane in line.lanes:
        _draw_lane(axes, lane, y[lane.row], t0, line.rolled_back(lane))
    steps = _draw_step_numbers(axes, line, y, t0)
    _draw_between(axes, line, y, t0)
    saved = []
    for step, when in line.checkpoints.items():
        axes.plot(when - t0, -0.8, "D", color=_SAVED, markersize=7, zorder=4)
        saved.append(axes.annotate(
            str(step), (when - t0, -0.8), xytext=(0, -7), textcoords="offset points",
            ha="center", va="top", color=_SAVED, fontsize=7,
        ))  # fmt: skip
    lost = []
    for lane in line.lost:
        axes.plot(lane.end - t0, y[lane.row], "X", color=_LOST, markersize=12, zorder=5)
        lost.append(axes.annotate(
            f"lost in step {lane.last_step}", (lane.end - t0, y[lane.row]),
            xytext=(0, -11), textcoords="offset points", ha="center", va="top",
            color=_LOST, fontsize=8, fontweight="bold", bbox=_BEHIND,
        ))  # fmt: skip
    moved = []
    for t in line.transitions:
        color = {"regroup": _REGROUP, "rejoin": _REJOIN}.get(t.kind, _RESTART)
        for where in (axes, top) if top is not None else (axes,):
            where.axvline(t.time - t0, color=color, linestyle="--", linewidth=1.4, zorder=1)
        if top is not None:
            moved.append(top.annotate(
                t.label, (t.time - t0, 1.0), xycoords=("data", "axes fraction"),
                xytext=(3, -2), textcoords="offset points", ha="left", va="top",
                color=color, fontsize=8, fontweight="bold", bbox=_BEHIND,
            ))  # fmt: skip
    epochs = _draw_epochs(axes, line, t0)
    word = "slot" if line.by_slot else "rank"
    labels = ["checkpoints\n(after step)", *(_row_label(line, row, word) for row in rows)]
    axes.set_yticks([-0.8, *range(len(rows))], labels, fontsize=8)
    axes.set_ylim(len(rows) - 0.45, -1.45)  # row 0 on top; above it the checkpoints
    axes.set_xlim(left=-0.01 * (max(lane.end for lane in line.lanes) - t0))
    axes.set_xlabel("wall time since the first record (s)")
    axes.grid(axis="x", color="#eeeeee")
    axes.set_axisbelow(True)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    kinds = {t.kind for t in line.transitions}
    pids = [(lane.attempt, lane.pid, lane.row) for lane in line.lanes if lane.pid is not None]
    shown = {
        "step": True,
        "rolled": any(line.rolled_back(lane) for lane in line.lanes),
        "lost": bool(line.lost),
        "saved": bool(line.checkpoints),
        "between": any((a + 1, pid, row) in pids for a, pid, row in pids),
    }
    handles: list[Artist] = [
        handle for key, handle in (
            ("step", Line2D([], [], color=_TICK, marker="|", linestyle="", markersize=10,
                            label="optimizer step")),
            ("rolled", Line2D([], [], color=_ROLLED, marker="|", linestyle="", markersize=10,
                              label="step rolled back (trained again)")),
            ("lost", Line2D([], [], color=_LOST, marker="X", linestyle="", markersize=9,
                            label="process lost")),
            ("saved", Line2D([], [], color=_SAVED, marker="D", linestyle="", markersize=6,
                             label="checkpoint (after step N)")),
            ("between", Line2D([], [], color=_BETWEEN, linestyle=":",
                               label="same process (regrouping, waiting)")),
            ("regroup", Line2D([], [], color=_REGROUP, linestyle="--",
                               label="regroup (a rank lost)")),
            ("rejoin", Line2D([], [], color=_REJOIN, linestyle="--", label="rejoin (a rank back)")),
            ("restart", Line2D([], [], color=_RESTART, linestyle="--",
                               label="restart (every process new)")),
        )
        if shown.get(key, key in kinds)
    ]  # fmt: skip
    handles += _attempt_patches(line, Patch)
    drawn.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    if title:
        (top if top is not None else axes).set_title(title, fontsize=10, loc="left")
    # Lay the labels out once the layout has placed the axes, then keep it where it is.
    drawn.canvas.draw()
    drawn.set_layout_engine("none")
    used = _lay_out(drawn, [
        (moved, [(3, -2 - k * _LEVEL_PT) for k in range(levels)]),
        (lost, [(0, -11), (0, 9), (48, -11), (-48, -11)]),
        (saved, [(0, -7)]),
        (steps, [(0, 9)]),
        (epochs, [(2, 2)]),
    ])  # fmt: skip
    return drawn, used


def _attempt_patches(line: Timeline, patch: Any) -> list[Any]:
    """The legend's attempt swatches: every attempt while few, else the first and the last
    few (the summary lists them all)."""
    listed = list(enumerate(line.attempts))
    if len(listed) > 8:
        listed = [*listed[:3], *listed[-3:]]
    out = [
        patch(color=_BARS[i % len(_BARS)], label=f"attempt {i}: {world} ranks from step {start}")
        for i, (_, start, world) in listed
    ]
    if len(listed) < len(line.attempts):
        out.insert(3, patch(color="white", label=f"... {len(line.attempts) - 6} more"))
    return out


def _lay_out(drawn: Figure, groups: list[tuple[list[Any], list[tuple[float, float]]]]) -> int:
    """Place each group's labels in turn (first groups first) at the first of their offsets
    (points) where they cover no label placed before, else leave them out. Returns how many
    of the first group's offsets (rows) were taken."""
    renderer = drawn.canvas.get_renderer()  # type: ignore[attr-defined]
    placed = [t.get_window_extent(renderer) for t in drawn.findobj(_is_fixed_text)]
    used = 0
    for g, (texts, offsets) in enumerate(groups):
        for text in sorted(texts, key=lambda t: t.xy[0]):
            for k, offset in enumerate(offsets):
                text.xyann = offset
                box = text.get_window_extent(renderer)
                if not any(box.overlaps(other) for other in placed):
                    placed.append(box)
                    if g == 0:
                        used = max(used, k + 1)
                    break
            else:
                text.set_visible(False)
    return used


def _is_fixed_text(artist: Any) -> bool:
    """Text the layout does not move: tick labels, axis labels, titles, the legend's."""
    from matplotlib.text import Annotation, Text

    return (
        isinstance(artist, Text)
        and not isinstance(artist, Annotation)
        and artist.get_visible()
        and bool(artist.get_text())
    )


def _draw_lane(axes: Axes, lane: Lane, y: int, t0: float, rolled_back: set[int]) -> None:
    """The process's bar (first to last record), a tick per step, its checkpoints."""
    color = _BARS[lane.attempt % len(_BARS)]
    axes.barh(y, lane.end - lane.start, left=lane.start - t0, height=0.5, color=color, zorder=2)
    for step, when in lane.steps.items():
        tick = _ROLLED if step in rolled_back else _TICK
        axes.plot(when - t0, y, "|", color=tick, markersize=14, markeredgewidth=1.6, zorder=3)


def _draw_between(axes: Axes, line: Timeline, y: dict[int, int], t0: float) -> None:
    """A dotted line where one process goes from an attempt to the next (a survivor regrouping,
    or waiting in its step for a joiner): alive, not training."""
    for lane in line.lanes:
        if lane.pid is None:
            continue
        for other in line.lanes:
            if other.attempt != lane.attempt + 1 or (other.pid, other.row) != (lane.pid, lane.row):
                continue
            axes.plot(
                [lane.end - t0, other.start - t0], [y[lane.row]] * 2, ":", color=_BETWEEN,
                linewidth=1.5, zorder=1,
            )  # fmt: skip


def _draw_step_numbers(axes: Axes, line: Timeline, y: dict[int, int], t0: float) -> list[Any]:
    """The step numbers above the top row of each attempt, as many as fit (about 16 px each);
    returns them."""
    texts = []
    span = max(lane.end for lane in line.lanes) - t0 or 1.0
    px_per_s = 780 / span  # the axes are about 780 px wide
    for attempt in range(len(line.attempts)):
        lanes = [lane for lane in line.lanes if lane.attempt == attempt and lane.steps]
        if not lanes:
            continue
        top = min(lanes, key=lambda lane: lane.row)
        last = -1e9
        for step, when in sorted(top.steps.items()):
            if (when - last) * px_per_s < 16:
                continue
            last = when
            texts.append(axes.annotate(
                str(step), (when - t0, y[top.row]), xytext=(0, 9), textcoords="offset points",
                ha="center", va="bottom", color=_TICK, fontsize=7,
            ))  # fmt: skip
    return texts


def _draw_epochs(axes: Axes, line: Timeline, t0: float) -> list[Any]:
    """A faint line where each epoch after the first starts (its first micro-batch), and its
    label (returned)."""
    texts = []
    starts: dict[int, float] = {}
    for lane in line.lanes:
        for step, epoch in lane.epochs.items():
            when = lane.steps[step]
            if epoch > 0 and when < starts.get(epoch, float("inf")):
                starts[epoch] = when
    for epoch, when in sorted(starts.items()):
        axes.axvline(when - t0, color="#999999", linestyle=":", linewidth=1, zorder=1)
        texts.append(axes.annotate(
            f"epoch {epoch}", (when - t0, 0.0), xycoords=("data", "axes fraction"),
            xytext=(2, 2), textcoords="offset points", fontsize=7, color="#666666",
        ))  # fmt: skip
    return texts


def _row_label(line: Timeline, row: int, word: str) -> str:
    pids = [lane.pid for lane in line.lanes if lane.row == row and lane.pid is not None]
    unique = list(dict.fromkeys(pids))
    if not line.by_slot or not unique:
        return f"{word} {row}"
    if len(unique) > 3:  # a slot restarted many times: its first and last process
        return f"{word} {row}\npid {unique[0]} .. {unique[-1]} ({len(unique)})"
    return f"{word} {row}\npid {', '.join(map(str, unique))}"
