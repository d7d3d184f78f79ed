"""The planner's predicted step against measured runs: each example config (and some at GPT
small, where compute dominates) trained by ``shardwise-train`` on this machine for a few steps,
in fresh launches interleaved across the configs; the prediction is the one the run itself
prints at its start (``prediction.for_config``), the measurement the median ``step_s`` after the
first step (min / median / max over launches) and the largest rank's peak RSS.

Run: python benchmarks/bench_step_time.py --launches 3 \
    --output benchmarks/results/DATE-step-time-cpu.md
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from report import emit, table

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    # name: (processes, config, overrides)
    "DDP, tiny": (2, "ddp.yaml", []),
    "DDP, small": (2, "ddp.yaml", ["model.preset=small", "training.micro_batch_size=2"]),
    "FSDP full_shard, small, checkpointing": (2, "fsdp.yaml", []),
    "ZeRO-2, tiny": (2, "zero2.yaml", []),
    "ZeRO-2, small": (2, "zero2.yaml", ["model.preset=small", "training.micro_batch_size=4"]),
    "ZeRO-3, small": (
        2,
        "zero2.yaml",
        ["model.preset=small", "distributed.zero.zero_optimization.stage=3"],
    ),
    "demo (FSDP, bf16)": (2, "demo.yaml", []),
    "pipeline 1F1B": (2, "pipeline_1f1b.yaml", []),
    "pipeline 1F1B, small": (2, "pipeline_1f1b.yaml", ["model.preset=small"]),
    "pipeline 1F1B, small, split by time": (
        2,
        "pipeline_1f1b.yaml",
        ["model.preset=small", "distributed.pipeline.split=time"],
    ),  # fmt: skip
    "fsdp x tp 2 x 2": (4, "fsdp_x_tp.yaml", []),
    "dp x pp 2 x 2": (4, "dp_x_pp.yaml", []),
}
HEAD = ["run", "ranks", "row", "predicted s", "measured s min / median / max", "error",
        "predicted RSS MiB", "measured RSS MiB", "RSS error"]  # fmt: skip
PREDICTED = re.compile(r"predicted step \(([^)]*?) on (\w+), .*?\): ([0-9.e+-]+) s")


def launch(nproc, config, overrides, steps, workdir, index):
    out = Path(workdir) / f"{config.replace('.yaml', '')}-{abs(hash(tuple(overrides)))}-{index}"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "shardwise.train",
        "--config", str(ROOT / "examples" / "configs" / config),
        f"training.max_steps={steps}", "training.warmup_steps=1", "training.log_every=1",
        f"training.checkpoint.dir={out}", f"training.checkpoint.every_steps={steps}",
        "training.eval_every=0", *overrides,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, cwd=workdir)
    if done.returncode:
        raise RuntimeError(f"{config} {overrides} failed:\n{done.stderr[-3000:]}")
    found = PREDICTED.search(done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"{config}: no prediction printed:\n{done.stdout[-2000:]}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps_s = [r["step_s"] for r in records if "step_s" in r][1:]
    rss = max(max(r["peak_rss_mb_per_rank"]) for r in records if "peak_rss_mb_per_rank" in r)
    return found.group(1), float(found.group(3)), statistics.median(steps_s), rss


def _predicted_rss(nproc, config, overrides) -> float:
    from shardwise.train import config_plan, prediction
    from shardwise.train.config import load_config

    cfg = load_config(str(ROOT / "examples" / "configs" / config), overrides,
                      env={"WORLD_SIZE": str(nproc)})  # fmt: skip
    local = cfg.distributed.num_processes_per_node or nproc
    from shardwise.train.device import device_memory_bytes

    plan = config_plan.plan_for_config(cfg, device_memory_bytes(local, "cpu"))
    return prediction.for_config(cfg, plan, "cpu").predicted["peak_rss_mb_per_rank"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--runs", help="names of RUNS separated by ; (default: all)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    runs = {k: v for k, v in RUNS.items() if not args.runs or k in args.runs.split(";")}
    got: dict[str, list] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as workdir:
        for index in range(args.launches):  # interleaved: every config once per round
            for name, (nproc, config, overrides) in runs.items():
                got[name].append(launch(nproc, config, overrides, args.steps, workdir, index))
                print(name, got[name][-1], flush=True)
    rows = []
    for name, (nproc, config, overrides) in runs.items():
        row_name, predicted = got[name][0][0], got[name][0][1]
        measured = sorted(g[2] for g in got[name])
        rss = max(g[3] for g in got[name])
        rss_plan = _predicted_rss(nproc, config, overrides)
        median = statistics.median(measured)
        rows.append([
            name, str(nproc), row_name, f"{predicted:.4g}",
            f"{measured[0]:.4g} / {median:.4g} / {measured[-1]:.4g}",
            f"{(predicted - median) / median:+.0%}", f"{rss_plan:.0f}", f"{rss:.0f}",
            f"{(rss_plan - rss) / rss:+.0%}",
        ])  # fmt: skip
    lines = [
        f"# Predicted against measured step time and peak RSS on the CPU ({datetime.date.today()})",
        "",
        f"- command: `python benchmarks/bench_step_time.py {' '.join(sys.argv[1:])}`",
        f"- {args.launches} fresh launches per config, interleaved; {args.steps} steps each; "
        "measured: the median step_s after the first step, min / median / max over launches; "
        "peak RSS: the largest rank's, over the launches",
        "- predicted: the line the run prints at its start (the config's planner row priced by "
        "this CPU's calibration, `python/shardwise/train/calibration.py`)",
        "",
        *table(HEAD, rows),
    ]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
