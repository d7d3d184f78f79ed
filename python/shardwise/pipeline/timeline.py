"""Pictures of an executed schedule: a text timeline for the terminal and a PNG (matplotlib), from
the measured start and end of every action of every rank (``Pipeline.gather_times``). Idle time
between compute actions is the bubble; both pictures mark it and give its share."""

from __future__ import annotations

from pathlib import Path

COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#8172B3"}


def _compute(names, times):
    """(kind, label, start, end) of the compute actions of one rank."""
    return [
        (name[0], name[1:], start, end)
        for name, (start, end) in zip(names, times, strict=True)
        if not name.startswith(("SEND", "RECV"))
    ]


def bubble_fraction(actions_per_rank, times_per_rank) -> float:
    """1 - compute time / (ranks × the longest rank's span)."""
    span = max(t[-1][1] for t in times_per_rank if t)
    busy = sum(
        end - start
        for names, times in zip(actions_per_rank, times_per_rank, strict=True)
        for _, _, start, end in _compute(names, times)
    )
    return 1.0 - busy / (len(times_per_rank) * span) if span > 0 else 0.0


def render_text(actions_per_rank, times_per_rank, width: int = 100) -> str:
    """One line per rank: F/B (the microbatch's last digit inside long blocks), '.' idle."""
    span = max(t[-1][1] for t in times_per_rank if t) or 1.0
    lines = []
    for rank, (names, times) in enumerate(zip(actions_per_rank, times_per_rank, strict=True)):
        row = ["."] * width
        for kind, label, start, end in _compute(names, times):
            a, b = (
                int(start / span * width),
                max(int(start / span * width) + 1, int(end / span * width)),
            )
            for c in range(a, min(b, width)):
                row[c] = kind
            if b - a >= 3:
                row[a + 1] = label.split(".")[-1][-1]
        lines.append(f"rank {rank} |{''.join(row)}|")
    bubble = bubble_fraction(actions_per_rank, times_per_rank)
    lines.append(
        f"{span * 1e3:.1f} ms; '.' = idle (bubble {bubble:.1%}); "
        "F forward, B backward, I input gradient, W weight gradient"
    )
    return "\n".join(lines)


def plot(actions_per_rank, times_per_rank, path: str | Path, title: str = "") -> Path:
    """A Gantt chart of the executed schedule, the bubble shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = len(times_per_rank)
    span = max(t[-1][1] for t in times_per_rank if t)
    fig, ax = plt.subplots(figsize=(12, 0.6 * ranks + 1.2))
    for rank, (names, times) in enumerate(zip(actions_per_rank, times_per_rank, strict=True)):
        ax.broken_barh([(0, span * 1e3)], (rank - 0.4, 0.8), facecolors="#EEEEEE")
        for kind, label, start, end in _compute(names, times):
            ax.broken_barh(
                [(start * 1e3, (end - start) * 1e3)],
                (rank - 0.4, 0.8),
                facecolors=COLORS.get(kind, "gray"),
                edgecolors="white",
                linewidth=0.5,
            )
            if (end - start) / span > 0.02:
                ax.text(
                    (start + end) / 2 * 1e3,
                    rank,
                    label,
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("ms (grey: idle, the bubble)")
    bubble = bubble_fraction(actions_per_rank, times_per_rank)
    ax.set_title(f"{title} bubble {bubble:.1%}".strip())
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
