"""``shardwise-train`` (also ``python -m shardwise.train``): trains the bundled GPT on the bundled
corpus with DDP, FSDP, ZeRO or a pipeline, as a YAML config plus dotted overrides say::

    torchrun --nproc_per_node=2 -m shardwise.train --config examples/configs/fsdp.yaml \\
        training.max_steps=50 model.mesh_shape=[[2,1],["fsdp","tp"]]

Before anything is built, the config is validated (``config.py``) and the memory planner
(``planner.py``) estimates the bytes per rank; a run it says will not fit is refused unless
``--ignore-memory-check``. Runs resume from the newest intact checkpoint in
``training.checkpoint.dir`` unless ``--no-resume``. The command is a caller of
``shardwise.Trainer`` (``api.py``): it parses the command line into a config and trains it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from ..fsdp.config import FSDPConfig
from .api import MemoryCheckError, Trainer
from .config import TrainConfig, load_config
from .config_schema import FLAT_FSDP_KEYS, TrainingSection


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="shardwise-train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a YAML file (examples/configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: training.max_steps=20")
    parser.add_argument("--no-resume", action="store_true", help="start over, ignore checkpoints")
    parser.add_argument(
        "--ignore-memory-check", action="store_true", help="run even if the planner says no fit"
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="one process of a job launched by hand (MASTER_ADDR, MASTER_PORT, "
        "WORLD_SIZE and RANK in the environment or the distributed section)",
    )
    for flag, key in BOOLEAN_FLAGS.items():
        parser.add_argument(
            f"--{flag}",
            action=argparse.BooleanOptionalAction,
            dest=key,
            default=None,
            help=f"{key}=true (--no-{flag}: false)",
        )
    args = parser.parse_intermixed_args(argv)  # overrides may follow the flags
    flags = [(key, getattr(args, key)) for key in BOOLEAN_FLAGS.values()]
    args.overrides = [f"{k}={str(v).lower()}" for k, v in flags if v is not None] + args.overrides
    return args


def _boolean_flags() -> dict[str, str]:
    """``--use-fsdp`` and the other boolean keys a config may set flat (the FSDP keys written
    under ``distributed:``, the training section's), as flags: the flag's name is the key's with
    dashes, and it sets that key (given overrides win)."""
    fsdp = {f.name for f in dataclasses.fields(FSDPConfig) if f.type in (bool, "bool")}
    keys = [f"distributed.{k}" for k in FLAT_FSDP_KEYS if k in fsdp]
    keys += [
        f"training.{name}"
        for name, info in TrainingSection.model_fields.items()
        if info.annotation in (bool, bool | None)
    ]
    return {key.split(".")[-1].replace("_", "-"): key for key in keys}


BOOLEAN_FLAGS = _boolean_flags()


LAUNCH = (
    ("MASTER_ADDR", "master_addr"),
    ("MASTER_PORT", "master_port"),
    ("WORLD_SIZE", "world_size"),
    ("RANK", "rank"),
)  # the environment variable a process reads its place from, and the distributed key


def check_launch(cfg: TrainConfig, env=os.environ) -> None:
    """``--distributed`` (``distributed.enabled``, true for a world of several processes):
    this process's place in the job must be known before it starts."""
    given = cfg.distributed._launch_given
    missing = [var for var, key in LAUNCH if var not in env and key not in given]
    if missing:
        keys = ", ".join(f"distributed.{k}" for v, k in LAUNCH if v in missing)
        raise ValueError(
            f"--distributed (distributed.enabled): this process does not know "
            f"{', '.join(missing)}; export them "
            f"(a multi-node job launched by hand), set {keys} in the config, or launch with "
            "torchrun"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = [*args.overrides, *(["distributed.enabled=true"] if args.distributed else [])]
    try:
        cfg = load_config(args.config, overrides)
        if cfg.distributed.enabled:  # --distributed, the key, or a world of several processes
            check_launch(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"shardwise-train: {e}", file=sys.stderr)
        return 2
    trainer = Trainer(config=cfg, resume=not args.no_resume,
                      check_memory=not args.ignore_memory_check)  # fmt: skip
    try:
        trainer.train()
    except MemoryCheckError as refused:
        print(f"shardwise-train: refusing a run that will not fit: {refused.note}", file=sys.stderr)
        print("(pass --ignore-memory-check to run anyway)", file=sys.stderr)
        return 3
    import torch.distributed as dist

    if dist.is_initialized():  # gloo's worker threads abort the interpreter's teardown otherwise
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
