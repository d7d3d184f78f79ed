"""Training across emulated hosts, beside the peers: the bundled GPT trained on K network
namespaces x R ranks (tests/distributed/hosts.py, each host's link shaped with tc's tbf) by
shardwise's engines and by torch FSDP2 and DeepSpeed, fp32, AdamW, the same data and initial
weights in every row, fresh launches interleaved round by round.

Rows (ROWS): shardwise FSDP hybrid sharding (shards within a host, replicas across) beside torch
FSDP2 HSDP (the same bytes: parameters gathered within the host, gradients all-reduced across);
shardwise ZeRO-3 beside DeepSpeed ZeRO-3 (the same bytes); shardwise ZeRO-3 and FSDP with
DeepSpeed's ZeRO++ keys (hpZ: the secondary partition within the host; qwZ / qgZ: int8
parameter all-gather and gradient reduce-scatter). The peers run over gloo, their default CPU
backend, and over the shardwise backend (the engines compared alone). The limit, `compute`:
the same R*K processes on the same cores, each training the whole model alone (no byte is
communicated; each steps the whole model's optimizer, so the limit is slightly pessimistic).

Per row: tokens/s (the global batch over the slowest rank's step, median over the timed steps;
min / median / max over launches), the bytes the hosts' links carried per step (each host's
interface counter, /sys/class/net/IF/statistics/tx_bytes, summed over hosts: headers included,
the same count for every backend), and the largest relative difference of the loss curve from
shardwise ZeRO-3's in the same round. The first two steps are not timed.

Needs root (ip netns, tc). Run: python benchmarks/bench_hosts_training.py --hosts 4
--ranks-per-host 2 --rate 1gbit --output benchmarks/results/DATE-hosts-training-4x2-1gbit-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

from hosts import emulated_hosts, rate_argument, start_ranks, training_arguments  # noqa: E402
from report import emit, table  # noqa: E402

# A row: (engine, backend). The ZeRO++ rows' hpZ size is the ranks per host.
ROWS = {
    "shardwise-fsdp-hybrid": ("fsdp-hybrid", "shardwise"),
    "fsdp2-hsdp-gloo": ("fsdp2-hsdp", "gloo"),
    "fsdp2-hsdp-shardwise": ("fsdp2-hsdp", "shardwise"),
    "shardwise-zero3": ("zero3", "shardwise"),
    "deepspeed-zero3-gloo": ("deepspeed-zero3", "gloo"),
    "deepspeed-zero3-shardwise": ("deepspeed-zero3", "shardwise"),
    "shardwise-zero3-zeropp": ("zero3-zeropp", "shardwise"),
    "shardwise-fsdp-zeropp": ("fsdp-zeropp", "shardwise"),
    "compute": ("compute", None),
}
REFERENCE = "shardwise-zero3"
LR, WEIGHT_DECAY = 1e-3, 0.01


def ds_config(micro: int, zero: dict) -> dict:
    """The config shardwise.zero and DeepSpeed both read (torch's AdamW: DeepSpeed's fused Adam
    needs CUDA)."""
    return {"train_micro_batch_size_per_gpu": micro, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY,
                                                      "torch_adam": True}},
            "steps_per_print": 10**9}  # fmt: skip


def build(engine: str, model, args):
    """(forward, backward(loss), step()) of one engine; the process group is up."""
    import torch

    per_host, hosts = args.ranks_per_host, args.hosts
    if engine in ("zero3", "zero3-zeropp", "deepspeed-zero3"):
        zero = {"stage": 3}
        if engine == "zero3-zeropp":
            zero.update(zero_hpz_partition_size=per_host, zero_quantized_weights=True,
                        zero_quantized_gradients=True)  # fmt: skip
        if engine.startswith("deepspeed"):
            import deepspeed

            wrapped, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=ds_config(args.micro, zero))  # fmt: skip
        else:
            import shardwise.zero

            wrapped = shardwise.zero.initialize(model, ds_config(args.micro, zero))
        return wrapped, wrapped.backward, wrapped.step
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]
    if engine == "fsdp2-hsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (hosts, per_host), mesh_dim_names=("replicate", "shard"))
        for name in blocks:
            fully_shard(model.get_submodule(name), mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    elif engine in ("fsdp-hybrid", "fsdp-zeropp"):
        import shardwise

        if engine == "fsdp-hybrid":
            options = {"sharding_strategy": "hybrid_shard", "mesh": (hosts, per_host)}
        else:
            options = {"post_forward_shard_size": per_host, "quantized_all_gather": True,
                       "quantized_reduce_scatter": True}  # fmt: skip
        wrapped = shardwise.FullyShardedDataParallel(model, wrap=blocks, **options)
    else:  # compute: the model alone
        wrapped = model
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    return wrapped, lambda loss: loss.backward(), step


def link_bytes() -> int:
    """Bytes this host's interface has sent (every rank of the host shares the counter)."""
    name = os.environ["SHARDWISE_SOCKET_IFNAME"]
    return int(Path(f"/sys/class/net/{name}/statistics/tx_bytes").read_text())


def worker(row: str, args) -> None:
    """One rank: trains args.steps steps; rank 0 prints one JSON row per step (in `compute`,
    every process prints its own)."""
    import torch
    import torch.distributed as dist
    from shardwise.models.gpt import GPT, PRESETS
    from shardwise.train.data import TokenStream, corpus_splits

    engine, backend = ROWS[row]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if engine.startswith("deepspeed"):
        import deepspeed
        import shardwise  # noqa: F401  (registers the backend DeepSpeed may run over)

        deepspeed.init_distributed(dist_backend=backend)
    elif backend is not None:
        import shardwise  # noqa: F401

        dist.init_process_group(backend)
    cfg, micro = PRESETS[args.preset], args.micro
    torch.manual_seed(0)
    model = GPT(cfg)
    forward, backward, step = build(engine, model, args)
    counts = os.environ["LOCAL_RANK"] == "0" and backend is not None
    stream = TokenStream(corpus_splits()[0], cfg.seq_len, micro, rank, world, seed=0)
    for index in range(args.steps):
        inputs, targets = next(stream)
        if backend is not None:
            dist.barrier()
        start, sent = time.perf_counter(), link_bytes() if counts else 0
        loss = model.cross_entropy(forward(inputs), targets)
        backward(loss)
        step()
        seconds = time.perf_counter() - start
        sent = link_bytes() - sent if counts else 0
        totals = torch.tensor([loss.item(), float(sent)], dtype=torch.float64)
        slowest = torch.tensor([seconds], dtype=torch.float64)
        if backend is not None:
            dist.all_reduce(totals)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            totals[0] /= world
        if rank == 0 or backend is None:
            print(json.dumps({"step": index, "loss": totals[0].item(), "sent": totals[1].item(),
                              "seconds": slowest.item(),
                              "tokens": micro * world * cfg.seq_len}), flush=True)  # fmt: skip
    if backend is not None:
        dist.destroy_process_group()


def launch(hosts, row: str, args) -> list[dict]:
    """One fresh launch of every rank; per step, rank 0's row (`compute`: the slowest
    process's seconds, so the limit is the same R*K processes sharing the cores)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", row, "--preset",
            args.preset, "--steps", str(args.steps), "--micro", str(args.micro), "--hosts",
            str(args.hosts), "--ranks-per-host", str(args.ranks_per_host)]  # fmt: skip
    port = str(random.randint(20000, 60000))  # each namespace has ports of its own
    env = {"DS_ACCELERATOR": "cpu"}
    procs = start_ranks(hosts, args.ranks_per_host, argv, port, env)
    outputs = [p.communicate(timeout=args.timeout) for p in procs]
    if any(p.returncode for p in procs):
        errors = "".join(err[-2000:] for _, err in outputs)
        raise RuntimeError(f"{row} failed on {len(hosts)} x {args.ranks_per_host}:\n{errors}")
    per_rank = [
        [json.loads(x) for x in out.splitlines() if x.startswith("{")] for out, _ in outputs
    ]
    if row != "compute":
        return per_rank[0]
    return [max(steps, key=lambda r: r["seconds"]) for steps in zip(*per_rank, strict=True)]


def summary(runs: dict[str, list[list[dict]]], row: str) -> list[str]:
    """A row's cells: tokens/s min / median / max over launches, MB over the hosts' links per
    step, the last loss, the largest relative loss difference from REFERENCE's run in the same
    round."""
    timed = [run[2:] for run in runs[row]]
    rates = sorted(statistics.median(r["tokens"] / r["seconds"] for r in run) for run in timed)
    cells = [f"{rates[0]:.0f} / {statistics.median(rates):.0f} / {rates[-1]:.0f}"]
    if row == "compute":
        return [*cells, "0", "", ""]
    sent = statistics.median(statistics.median(r["sent"] for r in run) for run in timed)
    cells += [f"{sent / 1e6:.1f}", f"{statistics.median(run[-1]['loss'] for run in runs[row]):.4f}"]
    if REFERENCE in runs:
        drift = max(abs(a["loss"] - b["loss"]) / abs(b["loss"])
                    for ours, ref in zip(runs[row], runs[REFERENCE], strict=True)
                    for a, b in zip(ours, ref, strict=True))  # fmt: skip
        cells.append(f"{drift:.2e}")
    else:
        cells.append("")
    return cells


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    training_arguments(parser, hosts=4, steps=8)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per launch")
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.worker:
        return args
    unknown = set(args.rows.split(",")) - set(ROWS)
    if unknown:
        parser.error(f"--rows: unknown {sorted(unknown)}; choose from {', '.join(ROWS)}")
    if args.hosts < 2 or args.ranks_per_host < 2 or args.launches < 1 or args.steps < 3:
        parser.error("--hosts and --ranks-per-host need at least 2, --launches 1, --steps 3")
    args.shaped = rate_argument(parser, args.rate)
    return args


def main() -> int:
    args = parse()
    if args.worker:
        worker(args.worker, args)
        return 0
    import torch

    rows = args.rows.split(",")
    runs: dict[str, list[list[dict]]] = {row: [] for row in rows}
    with emulated_hosts(args.hosts, args.shaped) as hosts:
        for _ in range(args.launches):
            for row in rows:
                runs[row].append(launch(hosts, row, args))
                print(f"{row}: {statistics.median(r['seconds'] for r in runs[row][-1][2:]):.2f}"
                      " s/step", file=sys.stderr, flush=True)  # fmt: skip
    head = ["row", "tokens/s min / median / max", "MB over the hosts' links per step",
            "last loss (median)", f"max relative loss difference from {REFERENCE}"]  # fmt: skip
    lines = [
        f"# Training across {args.hosts} emulated hosts x {args.ranks_per_host} ranks, links "
        f"{args.rate} ({datetime.date.today()})",
        "",
        f"- machine: {os.cpu_count()} cores; torch {torch.__version__}; GPT preset "
        f"{args.preset}, fp32, {args.micro} sequence(s) per rank, {args.steps} steps (the first "
        f"two untimed), {args.launches} launches of each row, interleaved; data: the bundled "
        "corpus",
        f"- command: `python benchmarks/bench_hosts_training.py {' '.join(sys.argv[1:])}`",
        "",
        *table(head, [[row, *summary(runs, row)] for row in rows]),
    ]
    emit(lines, Path(args.output) if args.output else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
