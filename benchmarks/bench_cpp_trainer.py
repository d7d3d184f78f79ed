"""The C++ GPT trainer (``examples/cpp/train_gpt``, no Python in the step) against
``shardwise-train`` on the same model, data and FSDP configuration at world 2, on CPU.

Both train the bundled GPT on the bundled corpus with FSDP (full_shard, one unit per block)
over the shardwise backend. Both read the same batches (the C++ token stream), step with the
same fused AdamW kernel, use 1 thread per rank, fp32 and clip at 1.0, and run under torchrun.
The runs are interleaved, repeated, and each is started in fresh processes.

Reported per trainer:

- tokens/s, from the median step time of the slowest rank (the first step left out), as
  ``shardwise-train`` computes it;
- peak RSS, the largest ``ru_maxrss`` of any rank: torch's and (for Python) the interpreter's
  baseline included;
- the loss at the last step.

The limit row is the C++ trainer on one process with the same per-rank batch: what one rank
computes when nothing is communicated (two ranks on two cores reach at most twice it).
The one difference: the learning rate is constant in C++ and warm-up + cosine in Python. It
does not change a step's cost, so the losses are printed for information only.

Run: python benchmarks/bench_cpp_trainer.py --output benchmarks/results/DATE-cpp-trainer-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from report import emit

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "bench-train-gpt"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MODEL = {"dim": 192, "layers": 4, "heads": 6, "seq_len": 128}


def build_cpp() -> Path:
    """train_gpt built out of tree against this environment's shardwise (as make demo-cpp)."""
    import shardwise
    import torch

    command = ["cmake", "-S", str(ROOT / "examples/cpp/train_gpt"), "-B", str(BUILD)]
    command += ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"]
    command.append(
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{shardwise.cmake_prefix_path}"
    )
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if (home / "bin" / "nvcc").exists():
        command += [f"-DCUDA_TOOLKIT_ROOT_DIR={home}", f"-DCMAKE_CUDA_COMPILER={home}/bin/nvcc"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(BUILD)], check=True, stdout=subprocess.DEVNULL)
    return BUILD / "train_gpt"


def run_cpp(binary: Path, corpus: Path, steps: int, micro: int, world: int) -> dict:
    flags = [f"--{k.replace('_', '-')}" for k in MODEL]
    args = [str(binary), "--data", str(corpus), "--steps", str(steps), "--threads", "1"]
    args += ["--micro-batch", str(micro), "--log-every", str(steps), "--lr", "1e-3"]
    for flag, value in zip(flags, MODEL.values(), strict=True):
        args += [flag, str(value)]
    if world > 1:
        args = [TORCHRUN, "--no-python", "--standalone", f"--nproc_per_node={world}", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout
    summary = re.search(r"tokens/s ([0-9.]+) step_s ([0-9.]+) peak_rss_mib ([0-9.]+)", out)
    losses = re.findall(r"^step \d+ loss (\S+)", out, re.MULTILINE)
    return {
        "tokens_per_s": float(summary.group(1)),
        "peak_rss_mib": float(summary.group(3)),
        "loss": float(losses[-1]),
    }


def run_python(corpus_dir: Path, steps: int, micro: int) -> dict:
    out_dir = Path(tempfile.mkdtemp(dir=corpus_dir))
    config = {
        "model": {"preset": "tiny", **MODEL},
        "training": {
            "micro_batch_size": micro,
            "learning_rate": 1e-3,
            "warmup_steps": 0,
            "max_steps": steps,
            "mixed_precision": "no",
            "gradient_clip_norm": 1.0,
            "log_every": 1,
            "checkpoint": {"dir": str(out_dir), "every_steps": 10 * steps},
        },
        "distributed": {
            "strategy": "fsdp",
            "backend": "shardwise",
            "fsdp": {
                "fsdp_sharding_strategy": "full_shard",
                "fsdp_auto_wrap_policy": "transformer_auto_wrap",
            },
        },
    }
    path = out_dir / "config.json"
    path.write_text(json.dumps(config))
    args = [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "shardwise.train"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([*args, "--config", str(path)], check=True, capture_output=True, env=env)
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "step_s" in r]
    step_s = statistics.median(r["step_s"] for r in records[1:])
    tokens = micro * 2 * MODEL["seq_len"]
    return {
        "tokens_per_s": tokens / step_s,
        "peak_rss_mib": max(max(r["peak_rss_mb_per_rank"]) for r in records),
        "loss": records[-1]["loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    binary = build_cpp()
    runs: dict[str, list[dict]] = {"cpp": [], "python": [], "limit": []}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        subprocess.run(
            [sys.executable, "-m", "shardwise.train.data", str(corpus)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(args.repeats):  # interleaved
            runs["cpp"].append(run_cpp(binary, corpus, args.steps, args.micro_batch, 2))
            runs["python"].append(run_python(Path(tmp), args.steps, args.micro_batch))
            runs["limit"].append(run_cpp(binary, corpus, args.steps, args.micro_batch, 1))
    median = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    cpp, py = median["cpp"], median["python"]
    lines = [
        f"# C++ trainer vs shardwise-train, CPU, {datetime.date.today()}",
        "",
        f"Command: `python benchmarks/bench_cpp_trainer.py --steps {args.steps} --micro-batch "
        f"{args.micro_batch} --repeats {args.repeats}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; model: GPT {MODEL}, byte "
        f"vocabulary, fp32, FSDP full_shard over the shardwise backend, world 2, micro-batch "
        f"{args.micro_batch} per rank; median of {args.repeats} interleaved runs of {args.steps} "
        "steps each.",
        "",
        "| trainer | tokens/s | vs shardwise-train | peak RSS / rank (MiB) | last loss |",
        "|---|---|---|---|---|",
    ]
    for name, key in (
        ("C++ `train_gpt` (torchrun --no-python)", "cpp"),
        ("`shardwise-train` (Python)", "python"),
    ):
        m = median[key]
        lines.append(
            f"| {name} | {m['tokens_per_s']:.0f} | {m['tokens_per_s'] / py['tokens_per_s']:.2f}x "
            f"| {m['peak_rss_mib']:.0f} | {m['loss']:.3f} |"
        )
    limit = median["limit"]
    lines += [
        f"| limit: C++ on 1 process (no communication), per process | "
        f"{limit['tokens_per_s']:.0f} | - | {limit['peak_rss_mib']:.0f} | - |",
        "",
        f"Goal: >= 1.1x shardwise-train's tokens/s and less memory. Measured "
        f"{cpp['tokens_per_s'] / py['tokens_per_s']:.2f}x and "
        f"{cpp['peak_rss_mib']:.0f} vs {py['peak_rss_mib']:.0f} MiB per rank.",
        "",
        "Raw runs (tokens/s): "
        + "; ".join(
            k + ": " + ", ".join(f"{r['tokens_per_s']:.0f}" for r in v) for k, v in runs.items()
        ),
    ]
    emit(lines, args.output)


if __name__ == "__main__":
    main()
