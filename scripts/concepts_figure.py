"""Draw docs/img/global-order.png, the figure of docs/concepts.md, from rankwise itself.

    python scripts/concepts_figure.py [--out docs/img/global-order.png]

Every number in the picture comes from ``rankwise.data.DistributedSampler``: the epoch's global
order of 12 samples, each rank's strided share of it on 2 ranks, the cursor after two steps,
and the rest of the epoch re-split over 3 ranks after a resume.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from rankwise.data import DistributedSampler

N, SEED = 12, 0
COLOURS = ["#4c72b0", "#dd8452", "#55a868"]


def _shares(world: int, state: dict | None = None) -> list[list[int]]:
    samplers = [DistributedSampler(N, num_replicas=world, rank=r, seed=SEED) for r in range(world)]
    for sampler in samplers:
        if state is not None:
            sampler.load_state_dict(state)
    return [list(sampler) for sampler in samplers]


def _cell(ax: Axes, x: float, y: float, text: str, colour: str, *, faded: bool = False) -> None:
    ax.add_patch(Rectangle((x, y), 0.92, 0.8, facecolor=colour, alpha=0.25 if faded else 0.9, lw=0))
    ax.text(x + 0.46, y + 0.4, text, ha="center", va="center", color="black", fontsize=10)


def draw(out: Path) -> None:
    two = _shares(2)
    order = [s for pair in zip(*two, strict=True) for s in pair]  # positions 0..N-1
    first = DistributedSampler(N, num_replicas=2, rank=0, seed=SEED)
    first.advance(2)  # each of 2 ranks consumed 2 samples: the cursor is at position 4
    state = first.state_dict()
    cursor = state["consumed"]
    three = _shares(3, state)

    fig, ax = plt.subplots(figsize=(9, 3.6))
    row = 3.0
    ax.text(-0.3, row + 0.4, "global order\n(seed, epoch)", ha="right", va="center")
    for pos, sample in enumerate(order):
        _cell(ax, pos, row, str(sample), COLOURS[pos % 2], faded=pos < cursor)
        ax.text(pos + 0.46, row + 0.95, str(pos), ha="center", fontsize=7, color="grey")
    ax.annotate("", xy=(cursor, row - 0.15), xytext=(cursor, row + 1.25),
                arrowprops={"arrowstyle": "-", "lw": 2, "color": "black"})  # fmt: skip
    ax.text(cursor + 0.08, row + 1.25, f"cursor = {cursor} consumed", fontsize=9, va="bottom")

    for r, share in enumerate(two):
        y = 1.8 - 0.9 * r
        ax.text(-0.3, y + 0.4, f"2 ranks: rank {r}", ha="right", va="center")
        for j, sample in enumerate(share):
            _cell(ax, 2 * j + r, y, str(sample), COLOURS[r], faded=2 * j + r < cursor)

    ax.text(-0.3, -0.6, "resumed on 3 ranks", ha="right", va="center")
    for r, share in enumerate(three):
        for j, sample in enumerate(share):
            pos = cursor + 3 * j + r
            padding = pos >= N
            _cell(ax, pos, -1.0, f"{sample}*" if padding else str(sample), COLOURS[r])
    ax.text(N + 1.2, -0.6, "* padding: a duplicate\n  so every rank has 3", fontsize=8, va="center")

    ax.set_xlim(-4.2, N + 3.5)
    ax.set_ylim(-1.3, 4.6)
    ax.axis("off")
    ax.set_title("Each rank reads a strided slice of one seeded order; the cursor is global")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/img/global-order.png"))
    draw(parser.parse_args().out)
