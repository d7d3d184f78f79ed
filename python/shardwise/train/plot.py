"""``shardwise-plot RUN_DIR``: the loss curves (training, and the eval loss where it was measured),
the throughput and the cost (device-hours, or their price) of a run (its metrics.jsonl) as PNGs
beside it (matplotlib)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(run_dir: str | Path) -> list[Path]:
    """Writes loss.png, throughput.png and cost.png into ``run_dir`` from its metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read(run_dir / "metrics.jsonl")
    if not records:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no records; train first")
    written = []
    priced = any(r.get("cost") is not None for r in records)
    panels = [
        ("loss", ["loss", "val_loss"], "loss (nats/token)"),
        ("throughput", ["tokens_per_s"], "tokens/s (all ranks)"),
    ]
    if any("device_hours" in r for r in records):  # runs before the cost fields have none
        panels.append(("cost", ["cost"], "cost") if priced else
                      ("cost", ["device_hours"], "device-hours"))  # fmt: skip
    for name, keys, label in panels:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for key in keys:
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                style = "o-" if key == "val_loss" else "-"
                ax.plot(*zip(*points, strict=True), style, label=key, markersize=3)
        if len(keys) > 1:
            ax.legend()
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = run_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardwise-plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="the run's output directory (holds metrics.jsonl)")
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "metrics.jsonl").is_file():
        parser.error(
            f"run_dir: {args.run_dir}/metrics.jsonl does not exist; pass a run's output_dir"
        )
    for path in plot(args.run_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
