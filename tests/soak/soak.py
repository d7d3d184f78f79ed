"""Fault soak (issue 18, ``make soak``; outside CI): trials of ``shardwise-train`` at 2-4 ranks
where one random rank is SIGKILLed at a random moment (a random time into training, or right as
a checkpoint save begins), checking what a user relies on after a crash:

- every surviving rank exits non-zero within ``--timeout`` (no hang), its error naming the dead
  rank (``rank N``) and the operation it was in;
- nothing is left: no process of the trial, no ``/dev/shm`` segment, no temporary file;
- the newest complete checkpoint loads, and resuming from it reproduces the uninterrupted run's
  losses step for step (or, if the kill came before the first save, a fresh start does).

The ranks are started directly (``RANK``/``WORLD_SIZE`` set per process, no torchrun): torchrun's
agent would kill the survivors itself and hide whether the backend notices a dead peer.

``--link-cuts N`` adds N trials over TCP between two hosts (network namespaces on a bridge
pair, ``tests/distributed/hosts.py``; ranks split evenly between them): mid-training the link
is cut (``ip link set ... down``), which sends no FIN, so every rank must notice it through its
collective timeout (``distributed.timeout_s``, LINK_TIMEOUT_S here) and exit non-zero naming a
rank on the other host; the same leak, checkpoint and resume checks follow.

``--async-saves N`` adds N trials of the same kinds with asynchronous checkpoints
(``training.checkpoint.async``): a kill while the background writer writes must leave the
previous complete checkpoint, and the survivors (their writer blocked in its own gloo group)
must exit.

Writes ``soak.md`` (the table and one row per trial) and ``trials.jsonl`` to ``--out``.
Run: python tests/soak/soak.py --trials 100 --out build/soak
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))  # this checkout's shardwise, not another install's
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
from hosts import can_make_namespaces, in_host, two_hosts  # noqa: E402
from shardwise.train import checkpoint  # noqa: E402

CONFIGS = ROOT / "examples" / "configs"
STEPS = 24
EVERY = 6
OVERRIDES = [
    "model.preset=tiny",
    "training.mixed_precision=no",
    "training.learning_rate=3e-3",
    "training.warmup_steps=2",
    "training.log_every=1",
    "training.micro_batch_size=4",
    "training.gradient_accumulation_steps=1",
    f"training.max_steps={STEPS}",
    f"training.checkpoint.every_steps={EVERY}",
    "training.checkpoint.keep_last=2",
]
STRATEGIES = {"ddp": "ddp.yaml", "fsdp": "fsdp.yaml", "zero": "zero2.yaml"}
LINK_TIMEOUT_S = 10.0  # link-cut trials' distributed.timeout_s: the only way to notice a cut
# Words an error uses for the operation a rank was in (the backend's and the trainer's).
OPERATIONS = re.compile(
    r"all_reduce|all_gather|reduce_scatter|broadcast|barrier|send/recv|all_to_all|reduce|gather"
)


@dataclass
class Trial:
    index: int
    world: int
    strategy: str
    victim: int  # -1: no rank killed (a link cut)
    moment: str  # "training", "saving" or "link_cut"
    asynchronous: bool = False  # training.checkpoint.async
    kill_at_step: int = 0  # "training": killed once rank 0 has logged this step
    kill_after_s: float = 0.0  # ... and this long after
    hang: bool = False
    detection_s: float = 0.0  # kill -> last survivor's exit
    survivors_named_victim: bool = True
    survivors_named_operation: bool = True
    survivor_exit_codes: list[int] = field(default_factory=list)
    leaked_processes: int = 0
    leaked_shm: list[str] = field(default_factory=list)
    killed_writes: list[str] = field(default_factory=list)  # temp files the kill left
    leaked_temp_files: list[str] = field(default_factory=list)  # ... still there after resuming
    resumed_from: int | None = None
    checkpoint_lost: bool = False
    losses_match: bool = False
    note: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_of(rank: int, world: int) -> int:
    """Link-cut trials: ranks [0, world/2) on host 0, the rest on host 1."""
    return rank // (world // 2)


def launch(
    world: int,
    strategy: str,
    out: Path,
    label: str,
    hosts: list | None = None,
    asynchronous: bool = False,
) -> list[subprocess.Popen]:
    """Starts the ranks; rank r's output goes to <out>-<label>-rank<r>.log beside <out>. With
    ``hosts`` (two_hosts()), rank r runs in host_of(r)'s namespace under that host's name."""
    port = free_port()
    command = [
        sys.executable, "-m", "shardwise.train", "--config", str(CONFIGS / STRATEGIES[strategy]),
        *OVERRIDES, f"training.checkpoint.dir={out}",
    ]  # fmt: skip
    if hosts:
        command.append(f"distributed.timeout_s={LINK_TIMEOUT_S}")
    command.append(f"training.checkpoint.async={str(asynchronous).lower()}")
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SHARDWISE_SOAK_RUN=str(out),  # marks the trial's processes (leak check)
        )
        argv = command
        if hosts:
            host, per_host = host_of(rank, world), world // 2
            argv = in_host(hosts[host], host, argv)
            env.update(
                SHARDWISE_SOCKET_IFNAME=hosts[host].interface,
                MASTER_ADDR=hosts[0][1],
                LOCAL_RANK=str(rank % per_host),
                LOCAL_WORLD_SIZE=str(per_host),
            )
        log = open(log_path(out, label, rank), "w")  # noqa: SIM115
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def log_path(out: Path, label: str, rank: int) -> Path:
    return out.parent / f"{out.name}-{label}-rank{rank}.log"


def losses(out: Path) -> dict[int, float]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def run_to_end(
    world: int, strategy: str, out: Path, timeout: float, asynchronous: bool = False
) -> dict[int, float]:
    procs = launch(world, strategy, out, "to-end", asynchronous=asynchronous)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
    codes = [p.returncode for p in procs]
    if any(codes):
        log = log_path(out, "to-end", 0).read_text()[-3000:]
        raise RuntimeError(f"{out}: exit codes {codes}\n{log}")
    return losses(out)


def shm_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if "shardwise" in p.name}


def trial_processes(out: Path) -> list[int]:
    """Processes still running with this trial's marker in their environment."""
    found = []
    marker = f"SHARDWISE_SOAK_RUN={out}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def temporary_files(out: Path) -> list[str]:
    """Temporary files of unfinished writes (Python's .<name>.<x>.tmp, C++'s <name>.tmp.<pid>)."""
    return sorted(str(p) for p in out.rglob("*") if re.search(r"\.tmp$|\.tmp\.\d+$", p.name))


def kill_moment(
    trial: Trial, out: Path, procs, rng: random.Random, timeout: float, hosts: list | None
) -> bool:
    """Waits for the chosen moment and SIGKILLs the victim (a link cut: brings host 0's end of
    host 0's link down); False if the run ended first."""
    deadline = time.monotonic() + timeout
    if trial.moment == "saving":  # the first save after step 1: kill as its folder appears
        target = rng.choice(range(EVERY, STEPS, EVERY))
        folder = out / "checkpoints" / f"step-{target:08d}"
        while not folder.exists() and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.05))
    else:
        while max(losses(out), default=0) < trial.kill_at_step and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(trial.kill_after_s)
    if any(p.poll() is not None for p in procs):
        return False
    if hosts:
        namespace, _, interface = hosts[0]
        subprocess.run(["ip", "-n", namespace, "link", "set", interface, "down"], check=True)
    else:
        procs[trial.victim].send_signal(signal.SIGKILL)
    return True


# The backend's error: the rank reporting, then the transport's words, which begin with the rank
# they see themselves as. The two differ when a transport numbers ranks its own way (a hybrid's
# shared memory once named global rank 3 "rank 1"), and then every rank it names is suspect.
BACKEND_ERROR = re.compile(r"shardwise backend: rank (\d+): [\w/]+ #\d+ failed: rank (\d+):")


def names_the_fault(log: str, rank: int, trial: Trial) -> bool:
    """The survivor's error names itself rightly, and the dead rank, or (a link cut) a rank on the
    other host."""
    error = BACKEND_ERROR.search(log)
    if error is None or {int(error[1]), int(error[2])} != {rank}:
        return False
    if trial.moment != "link_cut":
        return f"rank {trial.victim}" in log
    other = [r for r in range(trial.world) if host_of(r, trial.world) != host_of(rank, trial.world)]
    return any(re.search(rf"\brank {r}\b", log) for r in other)


def run_trial(trial: Trial, base: Path, reference: dict, rng: random.Random, timeout: float):
    if trial.moment == "link_cut":
        with two_hosts() as hosts:
            strike(trial, base, rng, timeout, hosts)
    else:
        strike(trial, base, rng, timeout, None)
    out = base / f"trial-{trial.index:03d}"
    check_resume(trial, out, reference, timeout)
    trial.leaked_temp_files = temporary_files(out)
    if not trial.note and all(code == 0 for code in trial.survivor_exit_codes):
        trial.note = "killed after its last collective (the survivors finished): not counted"


def strike(trial: Trial, base: Path, rng: random.Random, timeout: float, hosts: list | None):
    """Runs the trial up to the fault and its aftermath: exits, errors, leaks."""
    out = base / f"trial-{trial.index:03d}"
    before = shm_segments()
    procs = launch(trial.world, trial.strategy, out, "killed", hosts, trial.asynchronous)
    if not kill_moment(trial, out, procs, rng, timeout, hosts):
        trial.note = "the run ended before the kill: not counted"
    killed_at = time.monotonic()
    survivors = [p for r, p in enumerate(procs) if r != trial.victim]
    for p in procs:
        try:
            p.wait(timeout=max(0.1, killed_at + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            trial.hang = True
            p.kill()
            p.wait()
    trial.detection_s = time.monotonic() - killed_at
    trial.survivor_exit_codes = [p.returncode for p in survivors]
    for rank in range(trial.world):
        if rank == trial.victim:
            continue
        log = log_path(out, "killed", rank).read_text(errors="replace")
        trial.survivors_named_victim &= names_the_fault(log, rank, trial)
        trial.survivors_named_operation &= bool(OPERATIONS.search(log))
    time.sleep(0.5)  # let the kernel reap what the survivors started
    trial.leaked_processes = len(trial_processes(out))
    trial.leaked_shm = sorted(shm_segments() - before)
    trial.killed_writes = temporary_files(out)


def check_resume(trial: Trial, out: Path, reference: dict, timeout: float) -> None:
    """The newest complete checkpoint loads, and the resumed run matches the reference."""
    saved_before = sorted((out / "checkpoints").glob("step-*/manifest.json"))
    newest = checkpoint.latest(out / "checkpoints") if saved_before else None
    if saved_before and newest is None:
        trial.checkpoint_lost = True
        return
    if newest is not None:
        trial.resumed_from = int(newest.name.split("-")[1])
        for rank in range(trial.world):
            checkpoint.load(newest, rank)  # weights_only; raises if unloadable
    resumed = run_to_end(trial.world, trial.strategy, out, timeout * 4, trial.asynchronous)
    start = (trial.resumed_from or 0) + 1
    trial.losses_match = all(
        step in resumed and abs(resumed[step] - reference[step]) <= 1e-6 * abs(reference[step])
        for step in range(start, STEPS + 1)
    )


def passed(t: Trial) -> bool:
    """Everything the soak asks of a trial held (a run that ended before its kill is no trial)."""
    if t.note:
        return True
    exited = all(code not in (0, None) for code in t.survivor_exit_codes)
    named = t.survivors_named_victim and t.survivors_named_operation
    clean = not (t.leaked_processes or t.leaked_shm or t.leaked_temp_files)
    return not t.hang and exited and named and clean and not t.checkpoint_lost and t.losses_match


def table(trials: list[Trial], command: str) -> str:
    ok_exit = sum(all(c not in (0, None) for c in t.survivor_exit_codes) for t in trials)
    killed = [t for t in trials if t.moment != "link_cut"]
    cut = [t for t in trials if t.moment == "link_cut"]

    def worst(group: list[Trial]) -> str:
        return f"{max(t.detection_s for t in group):.2f}" if group else "-"

    rows = [
        ("trials (a rank killed)", sum(not t.note for t in killed)),
        ("trials (the TCP link between two hosts cut)", sum(not t.note for t in cut)),
        ("hangs (a survivor alive after the timeout)", sum(t.hang for t in trials)),
        ("survivors exiting non-zero", f"{ok_exit} / {len(trials)}"),
        (
            "survivors naming the dead rank (a cut: a rank across the link)",
            sum(t.survivors_named_victim for t in trials),
        ),
        ("survivors naming the operation", sum(t.survivors_named_operation for t in trials)),
        ("leaked processes", sum(t.leaked_processes for t in trials)),
        ("leaked /dev/shm segments", sum(len(t.leaked_shm) for t in trials)),
        ("temporary files left by a killed write", sum(len(t.killed_writes) for t in trials)),
        ("... still there after resuming (leaked)", sum(len(t.leaked_temp_files) for t in trials)),
        ("lost or unloadable checkpoints", sum(t.checkpoint_lost for t in trials)),
        ("resumed runs matching the reference losses", sum(t.losses_match for t in trials)),
        ("worst detection time (kill to last exit), s", worst(killed)),
        (f"worst detection time (cut to last exit; timeout {LINK_TIMEOUT_S:g} s), s", worst(cut)),
    ]
    lines = ["# Fault soak: SIGKILL of a random rank; TCP link cuts", "", f"- command: `{command}`"]
    lines += ["", "| what | result |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| # | world | strategy | victim | moment | detect s | resumed from | ok |"]
    lines += ["|---:|---:|---|---:|---|---:|---:|---|"]
    for t in trials:
        good = passed(t)
        victim = "-" if t.victim < 0 else t.victim
        lines.append(
            f"| {t.index} | {t.world} | {t.strategy}{' async' * t.asynchronous} | {victim} | "
            f"{t.moment} | "
            f"{t.detection_s:.2f} | {t.resumed_from} | {'yes' if good else 'NO ' + t.note} |"
        )
    return "\n".join(lines) + "\n"


def next_trial(index: int, rng: random.Random, worlds: list[int], moments: list[str]) -> Trial:
    """The next trial from ``rng`` (the draws in the order the committed tables were made with)."""
    world, strategy = rng.choice(worlds), rng.choice(sorted(STRATEGIES))
    victim, moment = rng.randrange(world), rng.choice(moments)
    trial = Trial(index, world, strategy, -1 if moment == "link_cut" else victim, moment)
    trial.kill_at_step = rng.randrange(1, STEPS - 1)
    trial.kill_after_s = rng.uniform(0.0, 0.05)
    return trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100, help="trials killing a rank")
    parser.add_argument("--link-cuts", type=int, default=0, help="trials cutting a TCP link")
    parser.add_argument(
        "--async-saves", type=int, default=0, help="trials killing a rank, asynchronous saves"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to detect a death")
    args = parser.parse_args()
    if args.link_cuts and (reason := can_make_namespaces()):
        parser.error(f"--link-cuts: cannot make network namespaces here: {reason}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    references: dict[tuple[int, str], dict] = {}
    trials = []
    for index in range(args.trials + args.link_cuts + args.async_saves):
        if index < args.trials:
            trial = next_trial(index, rng, [2, 3, 4], ["training", "saving"])
        elif index < args.trials + args.link_cuts:
            trial = next_trial(index, rng, [2, 4], ["link_cut"])
        else:
            trial = next_trial(index, rng, [2, 3, 4], ["saving", "saving", "training"])
            trial.asynchronous = True
        key = (trial.world, trial.strategy)
        if key not in references:
            references[key] = run_to_end(
                *key, args.out / f"reference-{trial.world}-{trial.strategy}", args.timeout * 4
            )
        run_trial(trial, args.out, references[key], rng, args.timeout)
        trials.append(trial)
        with open(args.out / "trials.jsonl", "a") as f:
            f.write(json.dumps(asdict(trial)) + "\n")
        print(json.dumps(asdict(trial)), flush=True)
        text = table(trials, "python tests/soak/soak.py " + " ".join(sys.argv[1:]))
        (args.out / "soak.md").write_text(text)  # after every trial: a cut-short soak has its table
    print(text)
    return 1 if any(not passed(t) for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
