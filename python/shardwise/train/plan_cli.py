"""``shardwise-plan``: the memory planner (``planner.py``) on the command line, for a
shardwise-train config (``--config``) or for a parameter count and a machine (``--params``,
``--gpus``, ``--gpu-mem``); a table of the per-rank memory of each strategy and the simplest one
that fits, or ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from .device import device_memory_bytes
from .gpt_costs import gpt_gather_bytes
from .planner import GIB, Plan, activation_bytes, plan, plan_for_config
from .state_bytes import OPTIMIZERS, PRECISIONS


def _number(kind, minimum, what):
    def parse(text: str):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number; pass {what}") from None
        if kind is int and not value.is_integer():
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number; pass {what}")
        value = kind(value)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} must be >= {minimum}; pass {what}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    from shardwise.models.gpt import PRESETS

    p = argparse.ArgumentParser(
        prog="shardwise-plan",
        description="Per-rank memory of DDP, ZeRO 1-3, FSDP, pipeline and offload, and the "
        "simplest strategy that fits.",
    )
    p.add_argument("--config", help="a shardwise-train YAML: model, world, precision from it")
    p.add_argument("overrides", nargs="*", help="with --config: dotted overrides")
    p.add_argument("--params", type=_number(int, 1, "a parameter count such as 7e9"))
    p.add_argument(
        "--model", choices=sorted(PRESETS), help="take params and activations from a GPT preset"
    )
    p.add_argument("--gpus", type=_number(int, 1, "the number of GPUs, >= 1"))
    p.add_argument(
        "--gpus-per-host",
        type=_number(int, 1, "the GPUs of one host, dividing --gpus"),
        help="hosts = --gpus / this: each row's bytes per host link, and FSDP hybrid_shard "
        "recommended after DDP (with --config: distributed.num_processes_per_node)",
    )
    p.add_argument(
        "--gpu-mem",
        type=_number(float, 1e-9, "GiB per GPU such as 80"),
        help="default with --config: this host's memory (or GPU's) per local rank",
    )
    p.add_argument("--mixed-precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--micro-batch", type=_number(int, 1, "a micro-batch size >= 1"), default=1)
    p.add_argument("--seq-len", type=_number(int, 1, "a sequence length >= 1"))
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument(
        "--activations-gib",
        type=_number(float, 0, "GiB per rank, >= 0"),
        help="activation memory per rank when no --model gives an estimate",
    )
    p.add_argument(
        "--pipeline-stages",
        type=_number(int, 1, "a stage count dividing --gpus"),
        help="default: the fewest stages that fit",
    )
    p.add_argument("--overhead", type=_number(float, 1.0, "a multiplier >= 1.0"), default=1.1)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _plan_from_config(args, parser) -> Plan:
    """The plan for a shardwise-train config (``plan_for_config``)."""
    from .config import load_config

    if args.gpus_per_host is not None:
        parser.error(
            "--gpus-per-host is for --gpus without --config; with --config set "
            "distributed.num_processes_per_node (or distributed.num_nodes)"
        )

    env = {"WORLD_SIZE": str(args.gpus)} if args.gpus else {}
    # with --gpus the plan is for a machine with that many GPUs (a cuda config validates here)
    cfg = load_config(args.config, args.overrides, env=env, cuda_devices=args.gpus or None)
    if args.gpu_mem is not None:
        memory = int(args.gpu_mem * GIB)
    else:
        memory = device_memory_bytes(
            cfg.distributed.num_processes_per_node or cfg.distributed.world_size,
            cfg.training.device,
        )
    return plan_for_config(cfg, memory, args.optimizer, args.overhead)


def _plan_from_args(args, parser) -> Plan:
    from shardwise.models.gpt import PRESETS

    if args.config is not None:
        return _plan_from_config(args, parser)
    if args.overrides:
        parser.error(f"overrides {args.overrides} need --config FILE")
    if args.gpus is None or args.gpu_mem is None:
        parser.error(
            "--gpus and --gpu-mem are required without --config; e.g. --gpus 8 --gpu-mem 80"
        )
    if args.params is None and args.model is None:
        parser.error("--params or --model is required; e.g. --params 7e9 or --model 1b")
    if args.gpus_per_host is not None and args.gpus % args.gpus_per_host:
        parser.error(f"--gpus-per-host {args.gpus_per_host} must divide --gpus {args.gpus}")
    if args.pipeline_stages is not None and args.gpus % args.pipeline_stages:
        parser.error(f"--pipeline-stages {args.pipeline_stages} must divide --gpus {args.gpus}")
    dtype = 4 if args.mixed_precision == "fp32" else 2
    activations = int((args.activations_gib or 0) * GIB)
    params, gather = args.params, 0
    if args.model is not None:
        cfg = PRESETS[args.model]
        gather = gpt_gather_bytes(cfg, args.mixed_precision)
        params = params or cfg.num_parameters()
        if args.activations_gib is None:
            activations = activation_bytes(
                cfg, args.micro_batch, dtype, args.activation_checkpointing, seq_len=args.seq_len
            )
    return plan(
        params,
        args.gpus,
        int(args.gpu_mem * GIB),
        mixed_precision=args.mixed_precision,
        optimizer=args.optimizer,
        activation_bytes_per_rank=activations,
        pipeline_stages=args.pipeline_stages,
        overhead=args.overhead,
        zero3_gather_bytes=gather,
        ranks_per_host=args.gpus_per_host,
    )


def format_table(result: Plan) -> str:
    """A plain-text table, GiB per rank (communication: MiB sent per rank and optimizer step;
    across hosts also MiB each host sends over its link), and the recommendation."""
    hosts = result.hosts
    head = ("strategy", "params", "grads", "optimizer", "activations", "gathered", "total")
    head += ("x overhead", "fits", "comm MiB/step")
    on = f" on {hosts} hosts x {result.ranks_per_host}" if hosts > 1 else ""
    lines = [
        f"{result.params / 1e9:.3g}B parameters, {result.world_size} GPUs{on} x "
        f"{result.device_memory_bytes / GIB:.1f} GiB, {result.mixed_precision}, "
        f"{result.optimizer}, overhead {result.overhead:g} (GiB per rank)",
        f"{head[0]:<24}"
        + "".join(f"{h:>12}" for h in head[1:-1])
        + f"{head[-1]:>15}"
        + (f"{'host link MiB':>15}" if hosts > 1 else ""),
    ]
    for r in result.rows:
        label = f"{r.label} ({result.pipeline_stages})" if r.strategy == "pipeline" else r.label
        cells = (r.parameters, r.gradients, r.optimizer_state, r.activations, r.gathered)
        cells += (r.total, r.required)
        lines.append(
            f"{label:<24}"
            + "".join(f"{c / GIB:>12.2f}" for c in cells)
            + f"{'yes' if r.fits else 'no':>12}"
            + _mib(r.communication)
            + (_mib(r.inter_host) if hosts > 1 else "")
        )
    rec = result.recommendation
    lines.append(f"recommendation: {rec.strategy} ({rec.reason})")
    return "\n".join(lines)


def _mib(count: int | None) -> str:
    return f"{count / 2**20:>15.1f}" if count is not None else f"{'?':>15}"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        result = _plan_from_args(args, parser)
    except SystemExit as exit_:  # argparse: --help (0) or a bad argument (2)
        return int(exit_.code or 0)
    except ValueError as error:
        print(f"shardwise-plan: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
