"""The C++ GPT trainer (``examples/cpp/train_gpt``, no Python in the step) against
``shardwise-train`` on the same model, data and layout at world 2, on CPU.

Layouts (each trainer's own implementation of it, the same global batch of 2 x --micro-batch
rows per step):

- ``fsdp``: FSDP full_shard (one unit per block) over the shardwise backend, --micro-batch rows
  per rank;
- ``pp2``: two pipeline stages (split by parameters), 1F1B over 4 microbatches;
- ``tp2``: Megatron-style tensor parallelism over the 2 ranks (attention heads, MLP, vocabulary).

Both trainers read the same batches (the C++ token stream), step with the same fused AdamW
kernel and the same warm-up-free cosine learning rate, use 1 thread per rank, fp32, clip at 1.0,
and run under torchrun. The runs are interleaved, repeated, and each is started in fresh
processes.

Reported per trainer:

- tokens/s, from the median step time of the slowest rank (the first step left out), as
  ``shardwise-train`` computes it;
- peak RSS, the largest ``ru_maxrss`` of any rank: torch's and (for Python) the interpreter's
  baseline included;
- the loss at the last step.

The limit row of a layout is twice the C++ trainer's tokens/s on one process with the batch each
rank would compute if the work split perfectly (fsdp: --micro-batch rows; pp2 and tp2: the whole
batch, as a pipeline's stage or a tp rank sees every row): the ceiling of two ranks on two cores
when nothing is communicated and no pipeline stage waits.

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
from dataclasses import dataclass
from pathlib import Path

from report import emit

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "bench-train-gpt"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MODELS = {
    "base": {"dim": 192, "layers": 4, "heads": 6, "seq_len": 128},
    "small": {"dim": 64, "layers": 2, "heads": 4, "seq_len": 64},
}
MICROBATCHES = 4  # pp2's 1F1B microbatches per step


@dataclass(frozen=True)
class Layout:
    cpp: list[str]  # train_gpt's flags
    rows_per_rank: bool  # --micro-batch rows per rank (data parallel) or per step
    model: dict  # shardwise-train's model section additions
    distributed: dict  # and its distributed section

    def cpp_rows(self, micro: int) -> int:
        """train_gpt's --micro-batch for the global batch of 2 x micro rows."""
        return micro if self.rows_per_rank else 2 * micro

    def python_rows(self, micro: int) -> int:
        """shardwise-train's micro_batch_size for that batch (a pipeline's is per microbatch)."""
        if self.distributed["strategy"] == "pipeline":
            return 2 * micro // MICROBATCHES
        return self.cpp_rows(micro)


LAYOUTS = {
    "fsdp": Layout(
        [],
        True,
        {},
        {
            "strategy": "fsdp",
            "fsdp": {
                "fsdp_sharding_strategy": "full_shard",
                "fsdp_auto_wrap_policy": "transformer_auto_wrap",
            },
        },
    ),
    "pp2": Layout(
        ["--pp", "2", "--microbatches", str(MICROBATCHES)],
        False,
        {"mesh_shape": [[1, 2], ["dp", "pp"]]},
        {
            "strategy": "pipeline",
            "pipeline": {
                "schedule": "1f1b",
                "num_microbatches": MICROBATCHES,
                "split": "parameters",
            },
        },
    ),
    "tp2": Layout(
        ["--tp", "2"], False, {"mesh_shape": [[1, 2], ["dp", "tp"]]}, {"strategy": "ddp"}
    ),
}


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


def run_cpp(binary: Path, corpus: Path, model: dict, flags: list[str], steps: int, world: int):
    args = [str(binary), "--data", str(corpus), "--steps", str(steps), "--threads", "1"]
    args += ["--log-every", str(steps), "--lr", "1e-3", *flags]
    for key, value in model.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
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


def run_python(work: Path, model: dict, layout: Layout, steps: int, micro: int) -> dict:
    out_dir = Path(tempfile.mkdtemp(dir=work))
    config = {
        "model": {"preset": "tiny", **model, **layout.model},
        "training": {
            "micro_batch_size": layout.python_rows(micro),
            "learning_rate": 1e-3,
            "warmup_steps": 0,
            "max_steps": steps,
            "mixed_precision": "no",
            "gradient_clip_norm": 1.0,
            "log_every": 1,
            "checkpoint": {"dir": str(out_dir), "every_steps": 10 * steps},
        },
        "distributed": {"backend": "shardwise", **layout.distributed},
    }
    path = out_dir / "config.json"
    path.write_text(json.dumps(config))
    args = [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "shardwise.train"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([*args, "--config", str(path)], check=True, capture_output=True, env=env)
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "step_s" in r]
    step_s = statistics.median(r["step_s"] for r in records[1:])
    tokens = 2 * micro * model["seq_len"]
    return {
        "tokens_per_s": tokens / step_s,
        "peak_rss_mib": max(max(r["peak_rss_mb_per_rank"]) for r in records),
        "loss": records[-1]["loss"],
    }


def measure(binary: Path, corpus: Path, model: dict, args) -> dict[str, dict[str, list[dict]]]:
    """Per layout, the runs of each trainer and of the limit, interleaved."""
    runs = {name: {"cpp": [], "python": [], "limit": []} for name in args.layouts}
    for _ in range(args.repeats):
        for name in args.layouts:
            layout, micro, out = LAYOUTS[name], args.micro_batch, runs[name]
            flags = [*layout.cpp, "--micro-batch", str(layout.cpp_rows(micro))]
            out["cpp"].append(run_cpp(binary, corpus, model, flags, args.steps, 2))
            out["python"].append(run_python(corpus.parent, model, layout, args.steps, micro))
            one = ["--micro-batch", str(layout.cpp_rows(micro) if name == "fsdp" else 2 * micro)]
            limit = run_cpp(binary, corpus, model, one, args.steps, 1)
            out["limit"].append({**limit, "tokens_per_s": 2 * limit["tokens_per_s"]})
    return runs


def table(model_name: str, runs: dict[str, dict[str, list[dict]]]) -> list[str]:
    lines = [
        f"### {model_name}: GPT {MODELS[model_name]}",
        "",
        "| layout | trainer | tokens/s | vs shardwise-train | of the limit | peak RSS / rank (MiB) "
        "| last loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, layout_runs in runs.items():
        median = {
            k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in layout_runs.items()
        }
        py, limit = median["python"]["tokens_per_s"], median["limit"]["tokens_per_s"]
        for trainer, key in (("C++ `train_gpt`", "cpp"), ("`shardwise-train`", "python")):
            m = median[key]
            lines.append(
                f"| {name} | {trainer} | {m['tokens_per_s']:.0f} | {m['tokens_per_s'] / py:.2f}x "
                f"| {m['tokens_per_s'] / limit:.0%} | {m['peak_rss_mib']:.0f} | {m['loss']:.3f} |"
            )
        lines.append(f"| {name} | limit (2 x one process) | {limit:.0f} | - | 100% | - | - |")
    lines += ["", "Raw runs (tokens/s):", ""]
    for name, layout_runs in runs.items():
        lines.append(
            f"- {name}: "
            + "; ".join(
                k + " " + ", ".join(f"{r['tokens_per_s']:.0f}" for r in v)
                for k, v in layout_runs.items()
            )
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["base", "small"])
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    binary = build_cpp()
    lines = [
        f"# C++ trainer vs shardwise-train, CPU, {datetime.date.today()}",
        "",
        f"Command: `python benchmarks/bench_cpp_trainer.py --steps {args.steps} --micro-batch "
        f"{args.micro_batch} --repeats {args.repeats} --models {' '.join(args.models)} "
        f"--layouts {' '.join(args.layouts)}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch_version()}; byte "
        f"vocabulary, fp32, world 2, {2 * args.micro_batch} rows per step; median of "
        f"{args.repeats} interleaved runs of {args.steps} steps each.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        subprocess.run(
            [sys.executable, "-m", "shardwise.train.data", str(corpus)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for model_name in args.models:
            lines += table(model_name, measure(binary, corpus, MODELS[model_name], args))
    emit(lines, args.output)


def torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
