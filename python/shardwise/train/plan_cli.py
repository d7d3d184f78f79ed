"""``shardwise-plan``: the memory planner (``planner.py``) and the step-time model
(``step_time.py``) on the command line, for a shardwise-train config (``--config``) or for a
parameter count and a machine (``--params``, ``--gpus``, ``--gpu-mem``), or a cluster file
(``--cluster``); a table of the per-rank memory and the predicted step of each strategy, the
simplest one that fits and the fits ranked by predicted tokens/s, or ``--json``. Step times
need the model's shapes: a config or ``--model``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from . import prediction
from .cluster import DEVICES, Cluster, load_cluster
from .config_plan import plan_for_config
from .device import device_memory_bytes
from .gpt_costs import gpt_gather_bytes
from .planner import GIB, Plan, activation_bytes, plan
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
        "--nproc",
        type=_number(int, 1, "a number of processes, >= 1"),
        help="with --config: the ranks on this host, as torchrun --nproc_per_node N starts them",
    )
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
    p.add_argument(
        "--cluster",
        help="a cluster YAML (device, hosts, gpus_per_host, gpu_mem_gib, link GB/s) instead of "
        "--gpus / --gpu-mem / --gpus-per-host",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        help="whose rates price the step: cpu (this machine, measured) or a GPU (default: "
        "the cluster's, cpu for a CPU config or without GPUs, else h100)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _plan_from_config(args, parser, cluster: Cluster | None):
    """The plan for a shardwise-train config (``plan_for_config``) and its prediction."""
    from .config import load_config

    if args.gpus_per_host is not None:
        parser.error(
            "--gpus-per-host is for --gpus without --config; with --config set "
            "distributed.num_processes_per_node (or distributed.num_nodes), or give --cluster"
        )
    if args.nproc is not None and (args.gpus is not None or cluster is not None):
        parser.error("--nproc is this host's ranks; give it without --gpus and --cluster")
    env = {"WORLD_SIZE": str(args.gpus)} if args.gpus else {}
    if args.nproc is not None:  # as torchrun --standalone --nproc_per_node N sets them
        env = {"WORLD_SIZE": str(args.nproc), "LOCAL_WORLD_SIZE": str(args.nproc)}
    devices = args.gpus or None  # a machine with that many GPUs (a cuda config validates here)
    if cluster is not None:
        env["LOCAL_WORLD_SIZE"] = str(cluster.gpus_per_host)
        devices = cluster.gpus_per_host if cluster.device != "cpu" else 0
    cfg = load_config(args.config, args.overrides, env=env, cuda_devices=devices)
    if args.gpu_mem is not None:
        memory = int(args.gpu_mem * GIB)
    else:
        memory = device_memory_bytes(
            cfg.distributed.num_processes_per_node or cfg.distributed.world_size,
            cfg.training.device,
        )
    result = plan_for_config(cfg, memory, args.optimizer, args.overhead)
    return result, prediction.for_config(cfg, result, args.device, cluster)


def _cluster(args, parser) -> Cluster | None:
    """``--cluster``'s file, which stands for --gpus, --gpu-mem and --gpus-per-host."""
    if args.cluster is None:
        return None
    given = [f for f, v in (("--gpus", args.gpus), ("--gpu-mem", args.gpu_mem),
                            ("--gpus-per-host", args.gpus_per_host)) if v is not None]  # fmt: skip
    if given:
        parser.error(f"--cluster gives the machine; drop {', '.join(given)}")
    cluster = load_cluster(args.cluster)
    args.gpus, args.gpu_mem = cluster.gpus, cluster.gpu_mem_gib
    if args.config is None and cluster.hosts > 1:
        args.gpus_per_host = cluster.gpus_per_host
    return cluster


def _plan_from_args(args, parser):
    """(the plan, its prediction or None: step times need the model's shapes)."""
    from shardwise.models.gpt import PRESETS

    cluster = _cluster(args, parser)
    if args.config is not None:
        return _plan_from_config(args, parser, cluster)
    if args.overrides:
        parser.error(f"overrides {args.overrides} need --config FILE")
    if args.nproc is not None:
        parser.error("--nproc needs --config FILE; without one give --gpus and --gpu-mem")
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
    params, gather, cfg = args.params, 0, None
    if args.model is not None:
        cfg = PRESETS[args.model]
        gather = gpt_gather_bytes(cfg, args.mixed_precision)
        params = params or cfg.num_parameters()
        if args.activations_gib is None:
            activations = activation_bytes(
                cfg, args.micro_batch, dtype, args.activation_checkpointing, seq_len=args.seq_len
            )
    result = plan(
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
    if cfg is None:
        return result, None
    device = args.device or (cluster.device if cluster else "h100")
    chosen = result.recommendation.row.strategy if result.recommendation.row else "zero3"
    return result, prediction.for_gpt(
        result,
        replace(cfg, seq_len=args.seq_len or cfg.seq_len),  # traced at the sequence trained
        micro_batch_size=args.micro_batch,
        checkpointing=args.activation_checkpointing,
        strategy=chosen,
        device=device,
        cluster=cluster,
    )


def format_table(result: Plan, predicted: prediction.Prediction | None = None) -> str:
    """A plain-text table, GiB per rank (communication: MiB sent per rank and optimizer step;
    across hosts also MiB each host sends over its link; with a prediction each row's step
    seconds and tokens/s), the recommendation, and the fits ranked by predicted tokens/s."""
    hosts = result.hosts
    times = predicted.times if predicted else {}
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
        + (f"{'host link MiB':>15}" if hosts > 1 else "")
        + (f"{'step s':>10}{'tokens/s':>12}" if times else ""),
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
            + (_time(times.get(r.strategy)) if times else "")
        )
    rec = result.recommendation
    lines.append(f"recommendation: {rec.strategy} ({rec.reason})")
    if predicted is not None:
        lines.append(f"fastest that fit (predicted tokens/s): {', '.join(predicted.ranking)}")
        lines.append(f"step times on {predicted.device}: {predicted.source}")
        if predicted.predicted:
            shown = ", ".join(
                f"{k} {v:.4g}" for k, v in predicted.predicted.items() if isinstance(v, float)
            )
            lines.append(f"predicted ({predicted.strategy}): {shown}")
    return "\n".join(lines)


def _time(t) -> str:
    return f"{t.step_s:>10.3g}{t.tokens_per_s:>12.0f}" if t is not None else f"{'?':>10}{'?':>12}"


def _mib(count: int | None) -> str:
    return f"{count / 2**20:>15.1f}" if count is not None else f"{'?':>15}"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        result, predicted = _plan_from_args(args, parser)
    except SystemExit as exit_:  # argparse: --help (0) or a bad argument (2)
        return int(exit_.code or 0)
    except ValueError as error:
        print(f"shardwise-plan: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = result.to_dict()
        out.update(predicted.to_dict() if predicted else {"predicted": None})
        print(json.dumps(out, indent=2))
    else:
        print(format_table(result, predicted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
