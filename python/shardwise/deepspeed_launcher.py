"""``shardwise-deepspeed``: DeepSpeed's launch line, ``deepspeed --num_gpus N script.py ARGS``,
over torchrun. Each process runs ``script.py --local_rank=<its local rank> ARGS`` (DeepSpeed's
launcher passes the flag, and scripts written for it parse it) with torchrun's variables set, so a
DeepSpeed script with ``import shardwise.deepspeed as deepspeed`` starts as it did::

    shardwise-deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds_config.json
    # is: torchrun --nproc_per_node 2 -m shardwise.deepspeed_launcher train.py ..., each
    # process told by SHARDWISE_DEEPSPEED_PROCESS to run the script

``--num_gpus`` (``--num_accelerators``) defaults to every GPU, or every CPU core on a machine
without one (torchrun's ``auto``). ``--num_nodes``, ``--node_rank``, ``--master_addr`` and
``--master_port`` map to torchrun's; ``--no_local_rank`` leaves the flag out. DeepSpeed's host
files and its pdsh/MPI launchers are refused, naming the torchrun line to use instead.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys

PROCESS = "SHARDWISE_DEEPSPEED_PROCESS"  # set for the processes: run the script (with the flag)
REFUSED = ("--hostfile", "-H", "--include", "-i", "--exclude", "-e", "--launcher", "--autotuning")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="shardwise-deepspeed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    parser.add_argument("--num_nodes", type=int, default=1)
    parser.add_argument("--node_rank", type=int, default=0)
    parser.add_argument("--master_addr", default=None, help="default 127.0.0.1")
    parser.add_argument("--master_port", type=int, default=None, help="default 29500")
    parser.add_argument("--no_local_rank", action="store_true")
    parser.add_argument("user_script")
    parser.add_argument("user_args", nargs=argparse.REMAINDER)
    for flag in REFUSED:
        if any(a == flag or a.startswith(flag + "=") for a in argv[: _script_index(argv)]):
            parser.error(
                f"{flag}: DeepSpeed's host files and pdsh/MPI launchers are not supported; run "
                "torchrun --nnodes ... --node_rank ... --master_addr ... on each host, or "
                "shardwise-deepspeed --num_nodes --node_rank --master_addr on each"
            )
    args = parser.parse_args(argv)
    if args.num_gpus == 0 or args.num_gpus < -1:
        parser.error(f"--num_gpus {args.num_gpus}: give a positive count (or leave it out: all)")
    return args


def _script_index(argv: list[str]) -> int:
    """Where the user's script starts: launcher flags before it, the script's own after."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py"):
            return i
    return len(argv)


def torchrun_command(args: argparse.Namespace) -> list[str]:
    nproc = "auto" if args.num_gpus == -1 else str(args.num_gpus)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if args.num_nodes == 1 and args.master_addr is None and args.master_port is None:
        command.append("--standalone")  # a free port on this host
    else:
        command += [
            f"--nnodes={args.num_nodes}",
            f"--node_rank={args.node_rank}",
            f"--master_addr={args.master_addr or '127.0.0.1'}",
            f"--master_port={args.master_port or 29500}",
        ]
    return [*command, "-m", "shardwise.deepspeed_launcher", args.user_script, *args.user_args]


def run_script(argv: list[str], local_rank_flag: bool) -> None:
    """One process: ``script --local_rank=<LOCAL_RANK> ARGS`` (DeepSpeed's order) in this
    interpreter, as ``python script.py`` would run it."""
    script, rest = argv[0], argv[1:]
    flag = [f"--local_rank={os.environ.get('LOCAL_RANK', '0')}"] if local_rank_flag else []
    sys.argv = [script, *flag, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    process = os.environ.pop(PROCESS, None)
    if process is not None:  # one of the processes torchrun started
        run_script(argv, local_rank_flag=process == "local_rank")
        return 0
    args = parse_args(argv)
    if not os.path.isfile(args.user_script):
        print(f"shardwise-deepspeed: no script {args.user_script!r}", file=sys.stderr)
        return 2
    env = dict(os.environ, **{PROCESS: "plain" if args.no_local_rank else "local_rank"})
    return subprocess.call(torchrun_command(args), env=env)


if __name__ == "__main__":
    sys.exit(main())
