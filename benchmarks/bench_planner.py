"""The memory planner against what training holds: runs ``shardwise-train`` for 2 steps per
strategy on 2 processes (4 for dp × pp) and compares the planner's per-rank parameters +
gradients + optimizer state with the tensor storages each rank holds at the end of its first
step (``model_state_bytes_per_rank`` in metrics.jsonl, the largest rank).

Run: python benchmarks/bench_planner.py --output benchmarks/results/DATE-planner-cpu.md
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from report import emit

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    # name: (processes, config, overrides, planner row, state precision, bf16 autocast)
    "DDP (fp32)": (2, "ddp.yaml", ["training.mixed_precision=no"], "ddp", "fp32", False),
    "FSDP full_shard (fp32 params, bf16 autocast)": (2, "fsdp.yaml", [], "zero3", "fp32", True),
    "ZeRO-1 (bf16)": (
        2,
        "zero2.yaml",
        ["distributed.zero.zero_optimization.stage=1"],
        "zero1",
        "bf16",
        True,
    ),
    "ZeRO-2 (bf16)": (2, "zero2.yaml", [], "zero2", "bf16", True),
    "ZeRO-3 (bf16)": (
        2,
        "zero2.yaml",
        ["distributed.zero.zero_optimization.stage=3"],
        "zero3",
        "bf16",
        True,
    ),
    "pipeline 1F1B, 2 stages (fp32)": (2, "pipeline_1f1b.yaml", [], "pipeline", "fp32", False),
    "dp × pp 2 × 2 (fp32)": (4, "dp_x_pp.yaml", [], "pipeline", "fp32", False),
}


def measure(nproc, config, overrides, model, workdir) -> int:
    out = Path(workdir) / config.replace(".yaml", "") / str(abs(hash(tuple(overrides))))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "shardwise.train",
        "--config",
        str(ROOT / "examples" / "configs" / config),
        f"model.preset={model}",
        "training.max_steps=2",
        "training.micro_batch_size=2",
        "training.warmup_steps=1",
        f"training.checkpoint.dir={out}",
        *overrides,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=workdir)
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return max(first["model_state_bytes_per_rank"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    from shardwise.models import PRESETS
    from shardwise.train import planner

    gpt = PRESETS[args.model]
    lines = [
        f"# Memory planner vs measured per-rank model state ({datetime.date.today()})",
        "",
        f"- command: `python benchmarks/bench_planner.py {' '.join(sys.argv[1:])}`",
        f"- GPT `{args.model}`: {gpt.num_parameters():,} parameters; AdamW; CPU",
        "- model state measured: storages of parameters, gradients and optimizer state (masters, "
        "moments) on the largest rank in step 1 at its peak: after backward (ZeRO) or the "
        "optimizer step (the others), before gradients are freed",
        "- activations measured: what autograd saves in one forward + loss of the whole model "
        "at micro-batch 2 (saved_tensors_hooks, parameters excluded), in the run's precision; "
        "the planner's number is fitted on 1- and 2-layer copies with 1 and 2 sequences",
        "",
        "| run | planner row | model state: planner MiB | measured MiB | ratio "
        "| activations: planner MiB | measured MiB | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as workdir:
        for name, (nproc, config, overrides, row_name, precision, bf16) in RUNS.items():
            measured = measure(nproc, config, overrides, args.model, workdir)
            stages = 2 if row_name == "pipeline" else 1
            plan = planner.plan(
                gpt.num_parameters(),
                nproc,
                2**40,
                mixed_precision=precision,
                pipeline_stages=stages,
                largest_stage_params=lambda p: planner.gpt_largest_stage_params(gpt, p),
            )
            row = plan.row(row_name)
            predicted = row.parameters + row.gradients + row.optimizer_state
            act_plan = planner.gpt_activation_bytes(gpt, 2, "bf16" if bf16 else "fp32")
            act_meas = planner._saved_bytes(gpt, 2, bf16)
            lines.append(
                f"| {name} | {row.label} | {predicted / 2**20:.2f} | {measured / 2**20:.2f} | "
                f"{measured / predicted:.3f} | {act_plan / 2**20:.1f} | {act_meas / 2**20:.1f} | "
                f"{act_meas / act_plan:.3f} |"
            )
            print(lines[-1], flush=True)
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
