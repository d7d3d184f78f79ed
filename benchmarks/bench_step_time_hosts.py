"""The planner's predicted step against runs across emulated hosts: example configs trained by
``shardwise-train`` on K network namespaces x 1 rank (``tests/distributed/hosts.py``), each
host on its own core (taskset) and its link shaped with tc's token bucket, in fresh launches
interleaved across the configs; the prediction is ``shardwise-plan --config C --cluster F
--json``'s ``predicted``, F describing the same hosts (device cpu, one core each, the shaped
rate as ``inter_host_gb_s``); the measurement is the median ``step_s`` after the first step
(min / median / max over launches).

Needs root (ip netns, tc) and a core per host. Run: python benchmarks/bench_step_time_hosts.py
--launches 3 --output benchmarks/results/DATE-step-time-hosts-cpu.md
"""

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from report import emit, table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

from hosts import emulated_hosts, rate_argument, rate_bits, start_ranks  # noqa: E402

RUNS = {
    # name: (config, overrides)
    "DDP, small": ("ddp.yaml", ["model.preset=small", "training.micro_batch_size=2"]),
    "FSDP full_shard, small, checkpointing": ("fsdp.yaml", []),
    "ZeRO-2, small": ("zero2.yaml", ["model.preset=small", "training.micro_batch_size=4"]),
    "ZeRO-3, small": (
        "zero2.yaml",
        ["model.preset=small", "distributed.zero.zero_optimization.stage=3"],
    ),
}
HEAD = ["run", "link", "row", "predicted s (comm s)", "measured s min / median / max", "error",
        "unshaped links: measured s (median)"]  # fmt: skip
UNSHAPED = "none"  # the links left at the veth's own speed: the step with (almost) no link cost


def cluster_file(folder: str, hosts: int, rate: str) -> str:
    """The cluster file of `hosts` emulated hosts of one core each, linked at `rate`."""
    path = Path(folder) / f"cluster-{rate}.yaml"
    from shardwise.train.device import device_memory_bytes

    memory = device_memory_bytes(hosts, "cpu") / 2**30  # this machine's memory, shared
    path.write_text(
        f"device: cpu\nhosts: {hosts}\ngpus_per_host: 1\ngpu_mem_gib: {memory:.1f}\n"
        f"cores_per_host: 1\ninter_host_gb_s: {rate_bits(rate) / 8e9}\n"
    )
    return str(path)


def predict(config: str, overrides: list[str], cluster: str) -> dict:
    """shardwise-plan's prediction of the config on the cluster file (its JSON)."""
    cmd = [sys.executable, "-m", "shardwise.train.plan_cli", "--config",
           str(ROOT / "examples" / "configs" / config), "--cluster", cluster, "--json",
           *overrides]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"shardwise-plan {config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def launch(hosts, config, overrides, steps, out: Path, timeout: float) -> float:
    """One fresh launch on every host; the median step_s after the first step."""
    argv = [
        sys.executable, "-m", "shardwise.train", "--config",
        str(ROOT / "examples" / "configs" / config), f"training.max_steps={steps}",
        "training.warmup_steps=1", "training.log_every=1", f"training.checkpoint.dir={out}",
        f"training.checkpoint.every_steps={steps}", "training.eval_every=0", *overrides,
    ]  # fmt: skip
    port = str(random.randint(20000, 60000))
    procs = start_ranks(hosts, 1, argv, port, cores=1)
    outputs = [p.communicate(timeout=timeout) for p in procs]
    if any(p.returncode for p in procs):
        errors = "".join(err[-2000:] for _, err in outputs)
        raise RuntimeError(f"{config} {overrides} failed:\n{errors}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median([r["step_s"] for r in records if "step_s" in r][1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--rates", default="1gbit,100mbit", help="the links, tc rates")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--runs", help="names of RUNS separated by ; (default: all)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if args.hosts < 2 or args.hosts > (os.cpu_count() or 1):
        parser.error(f"--hosts: give 2 to {os.cpu_count()} (a core per host)")
    rates = [UNSHAPED, *(r for r in args.rates.split(",") if r != UNSHAPED)]
    shaped = {rate: rate_argument(parser, rate) for rate in rates}
    runs = {k: v for k, v in RUNS.items() if not args.runs or k in args.runs.split(";")}
    measured: dict[tuple, list[float]] = {}
    plans: dict[tuple, dict] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for rate in rates:
            if rate != UNSHAPED:
                cluster = cluster_file(workdir, args.hosts, rate)
                for name, (config, overrides) in runs.items():
                    plans[name, rate] = predict(config, overrides, cluster)
            with emulated_hosts(args.hosts, shaped[rate]) as hosts:
                for index in range(args.launches):  # interleaved: every config once per round
                    for number, (name, (config, overrides)) in enumerate(runs.items()):
                        out = Path(workdir) / f"{rate}-{number}-{index}"
                        step = launch(hosts, config, overrides, args.steps, out, args.timeout)
                        measured.setdefault((name, rate), []).append(step)
                        print(rate, name, f"{step:.3f} s", flush=True)
    rows = []
    for (name, rate), plan in plans.items():
        got, p = sorted(measured[name, rate]), plan["predicted"]
        median = statistics.median(got)
        rows.append([
            name, rate, plan["strategy"], f"{p['step_s']:.4g} ({p['comm_s']:.3g})",
            f"{got[0]:.4g} / {median:.4g} / {got[-1]:.4g}",
            f"{(p['step_s'] - median) / median:+.0%}",
            f"{statistics.median(measured[name, UNSHAPED]):.4g}",
        ])  # fmt: skip
    lines = [
        f"# Predicted against measured step time across {args.hosts} emulated hosts "
        f"({datetime.date.today()})",
        "",
        f"- command: `python benchmarks/bench_step_time_hosts.py {' '.join(sys.argv[1:])}`",
        f"- {args.hosts} network namespaces x 1 rank, each on its own core, each link shaped "
        f"to the rate (tc tbf); {args.launches} fresh launches per config and link, "
        f"interleaved; {args.steps} steps each; measured: the median step_s after the first "
        "step, min / median / max over launches",
        "- predicted: `shardwise-plan --config C --cluster F --json`, F: device cpu, "
        f"{args.hosts} hosts, 1 rank and 1 core each, inter_host_gb_s the link's rate",
        "",
        *table(HEAD, rows),
    ]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
