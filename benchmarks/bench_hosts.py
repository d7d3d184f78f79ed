"""Collectives across emulated hosts: K network namespaces on a bridge, R ranks each, every
host's link rate-shaped with tc's tbf (tests/distributed/hosts.py), shardwise beside gloo.

Each backend runs in fresh launches, interleaved (shardwise, gloo, shardwise, ...), --launches
of each; every launch times every size as bench_collectives.py does (median of 5 batches, max
over ranks, the result checked exactly). Per size the table gives min / median / max busbw over
launches (nccl-tests' factors), and the link's limit: a host sends and receives at most the
shaped rate, so a flat ring (two inter-host neighbours per host; an all-reduce sends 2(n-1)/n of
the data over each, a reduce-scatter or all-gather (n-1)/n) has busbw at most rate / 8 bytes in
every op; the hierarchical algorithms send (H-1)/H of that where the flat ring sends (n-1)/n,
so theirs is (n-1)/n * H/(H-1) times higher.

Needs root (ip netns, tc). Run: python benchmarks/bench_hosts.py --hosts 4 --ranks-per-host 2
--rate 1gbit --output benchmarks/results/DATE-hosts-4x2-1gbit-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_collectives as bc  # noqa: E402
from hosts import emulated_hosts, rate_argument, rate_bits, start_ranks  # noqa: E402

# A column: the torch backend it runs and what it sets (shardwise-flat: the flat ring across hosts).
VARIANTS = {"shardwise": ("shardwise", {}), "gloo": ("gloo", {}),
            "shardwise-flat": ("shardwise", {"SHARDWISE_HIERARCHICAL": "0"})}  # fmt: skip


def launch(hosts, per_host: int, variant: str, op: str, nbytes: list[int]):
    """One fresh launch of len(hosts) * per_host ranks; rank 0's JSON rows."""
    backend, env_extra = VARIANTS[variant]
    argv = [sys.executable, str(Path(bc.__file__).resolve()), "--worker", backend, op,
            ",".join(map(str, nbytes))]  # fmt: skip
    port = str(random.randint(20000, 60000))  # each namespace has ports of its own
    procs = start_ranks(hosts, per_host, argv, port, env_extra)
    outputs = [p.communicate(timeout=1800) for p in procs]
    if any(p.returncode for p in procs):
        errors = "".join(err[-2000:] for _, err in outputs)
        raise RuntimeError(f"{variant} {op} failed on {len(hosts)} x {per_host}:\n{errors}")
    return [json.loads(line) for line in outputs[0][0].splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="each host's link: 10gbit, 1gbit, 100mbit, "
                        "any tc rate, or none (unshaped)")  # fmt: skip
    parser.add_argument("--ops", default="all_reduce")
    parser.add_argument("--min-bytes", type=bc.parse_bytes, default=64 << 10)
    parser.add_argument("--max-bytes", type=bc.parse_bytes, default=16 << 20)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--backends", default="shardwise,shardwise-flat,gloo",
                        help=f"columns, from {', '.join(VARIANTS)}")  # fmt: skip
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.hosts < 2 or args.ranks_per_host < 1 or args.launches < 1:
        parser.error("--hosts needs at least 2, --ranks-per-host and --launches at least 1")
    unknown = set(args.backends.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"--backends: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    rate = rate_argument(parser, args.rate)
    import torch

    world = args.hosts * args.ranks_per_host
    lines = [
        f"# Collectives across {args.hosts} emulated hosts x {args.ranks_per_host} ranks, "
        f"links {args.rate} ({datetime.date.today()})",
        "",
        f"- machine: {os.cpu_count()} cores; torch {torch.__version__}; hosts are network "
        "namespaces on a bridge, each link shaped with tc tbf in both directions",
        f"- command: `python benchmarks/bench_hosts.py {' '.join(sys.argv[1:])}`",
        "- float32; busbw per nccl-tests; per launch the max over ranks of the median of 5 timed "
        "batches; min / median / max over fresh launches, interleaved",
    ]
    if rate is not None:
        link, hosts_n = rate_bits(rate) / 8e9, args.hosts
        hierarchical = link * (world - 1) / world * hosts_n / (hosts_n - 1)
        lines.append(f"- link limit, every op: flat ring {link:.3f} GB/s busbw, hierarchical "
                     f"{hierarchical:.3f} GB/s busbw")  # fmt: skip
    lines.append("")
    print("\n".join(lines), flush=True)
    with emulated_hosts(args.hosts, rate) as hosts:
        for op in args.ops.split(","):
            nbytes = bc.sizes(args)
            backends = args.backends.split(",")
            runs: dict[str, list[list[dict]]] = {b: [] for b in backends}
            for _ in range(args.launches):
                for backend in backends:
                    runs[backend].append(launch(hosts, args.ranks_per_host, backend, op, nbytes))

            def busbw(row: dict, op: str = op) -> float:
                return row["bytes"] / row["time"] / 1e9 * bc.BUS_FACTOR[op](world)

            head = ["bytes"] + [f"{b} busbw GB/s min / median / max" for b in backends]
            head += [f"median shardwise/{b}" for b in backends if b != "shardwise"] + ["wrong"]
            block = [f"### {op}, {args.hosts} x {args.ranks_per_host}", "",
                     "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]  # fmt: skip
            for i in range(len(nbytes)):
                per = {b: [busbw(run[i]) for run in runs[b]] for b in backends}
                cells = [str(runs[backends[0]][0][i]["bytes"])]
                cells += [bc.spread(per[b]) for b in backends]
                cells += [f"{statistics.median(per['shardwise']) / statistics.median(per[b]):.2f}x"
                          for b in backends if b != "shardwise" and "shardwise" in per]  # fmt: skip
                cells.append(str(max(run[i]["wrong"] for b in backends for run in runs[b])))
                block.append("| " + " | ".join(cells) + " |")
            block.append("")
            print("\n".join(block), flush=True)
            lines += block
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
