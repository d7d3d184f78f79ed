"""Per-step metrics of ``shardwise-train``: throughput, an MFU estimate, peak memory per rank,
stragglers, and the sinks (JSONL, TensorBoard, a progress bar on rank 0).

MFU = achieved model FLOP/s per rank / the rank's peak FLOP/s. Model FLOPs per token follow
Kaplan et al. / PaLM: 6·N for the weight matmuls (forward + backward) plus 12·L·T·d for
attention (L layers, sequence T, width d), counted whether or not activations are recomputed.
On the CPU the peak is measured, not looked up: a square matmul in the training dtype on one
thread (the ranks of this job each use one), the best of a few repetitions. On a GPU it is the
data sheet's dense bf16 peak (``device.py``; measured for a GPU not listed there).
"""

from __future__ import annotations

import json
import resource
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist


def flops_per_token(num_params: int, layers: int, seq_len: int, dim: int) -> float:
    return 6.0 * num_params + 12.0 * layers * seq_len * dim


def measured_peak_flops(
    dtype: torch.dtype = torch.bfloat16, size: int = 1024, device: torch.device | str = "cpu"
) -> float:
    """FLOP/s of a size×size matmul in ``dtype`` on ``device`` (the CPU: this process's
    threads), best of 5 after a warm-up."""
    a = torch.randn(size, size).to(device, dtype)
    b = torch.randn(size, size).to(device, dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    best = float("inf")
    for _ in range(6):
        sync()
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def peak_rss_bytes() -> int:
    """The process's peak resident set: its memory map's high-water mark (``VmHWM``). Not
    getrusage's ru_maxrss where /proc has it: Linux carries ru_maxrss over an exec from the
    process that spawned this one, so a rank started by a larger process would report that
    process's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # KiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def gather_floats(values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (collective when a process group exists)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [values]
    t = torch.tensor(values, dtype=torch.float64)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


def gather_dicts(values: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's ``values`` (the same keys on every rank; collective)."""
    keys = sorted(values)
    return [dict(zip(keys, row, strict=True)) for row in gather_floats([values[k] for k in keys])]


PHASES = ("data", "forward", "backward", "forward_backward", "optimizer")


def phase_fields(per_rank: list[dict[str, float]]) -> dict:
    """Per phase (data, forward, backward — or a pipeline's forward_backward — optimizer): the
    slowest rank's seconds as ``<phase>_s`` and every rank's in ``phase_s_per_rank``."""
    out, lists = {}, {}
    for phase in PHASES:
        values = [r[phase] for r in per_rank if phase in r]
        if len(values) == len(per_rank):
            out[f"{phase}_s"] = max(values)
            lists[phase] = [round(v, 6) for v in values]
    return {**out, "phase_s_per_rank": lists}


def communication_delta(before: dict, after: dict) -> dict:
    """What the shardwise backend did between two ``_C.communication_stats()`` readings, per
    operation kind: calls, payload bytes, seconds."""
    out = {}
    for kind, now in after.items():
        was = before.get(kind, {"calls": 0, "bytes": 0, "seconds": 0.0})
        if now["calls"] != was["calls"]:
            out[kind] = {k: now[k] - was[k] for k in ("calls", "bytes", "seconds")}
    return out


def communication_line(step: int, delta: dict) -> str:
    parts = [
        f"{kind} {d['calls']} calls {d['bytes'] / 2**20:.2f} MiB {d['seconds'] * 1e3:.1f} ms"
        for kind, d in sorted(delta.items())
    ]
    return f"step {step} communication (rank 0): " + ("; ".join(parts) or "none")


class StepProfiler:
    """``training.profile``: torch.profiler over the steps its schedule picks (CPU, and CUDA
    when training there), written as a Chrome trace ``profile/rank<r>-step<n>.json`` in the run
    folder (open it in chrome://tracing or Perfetto); ``step()`` after every train step. The
    shardwise backend's operations appear in it as ``shardwise:<op>``."""

    def __init__(self, schedule: dict | None, directory: Path, rank: int, cuda: bool = False):
        self.prof = None
        if not schedule:
            return
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler import schedule as make_schedule

        folder = directory / "profile"
        folder.mkdir(parents=True, exist_ok=True)

        def write(prof):
            prof.export_chrome_trace(str(folder / f"rank{rank}-step{prof.step_num}.json"))

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = profile(
            activities=activities,
            schedule=make_schedule(
                wait=schedule["wait"],
                warmup=schedule["warmup"],
                active=schedule["active"],
                repeat=1,
            ),
            on_trace_ready=write,
            record_shapes=schedule.get("record_shapes", False),
        )
        self.prof.start()

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def close(self) -> None:
        if self.prof is not None:
            self.prof.stop()
            self.prof = None


def straggler(step_seconds: list[float], threshold: float = 1.25) -> int | None:
    """The rank whose compute time exceeds the median by ``threshold``×, or None."""
    if len(step_seconds) < 2:
        return None
    median = statistics.median(step_seconds)
    worst = max(range(len(step_seconds)), key=lambda r: step_seconds[r])
    return worst if step_seconds[worst] > threshold * median else None


class Sinks:
    """JSONL file, TensorBoard (when installed), a tqdm bar, and ``console.log`` in the run folder
    (every note and a line per logged step, what the console shows); rank 0 only."""

    def __init__(self, directory: Path, total_steps: int, start_step: int, enabled: bool):
        self.enabled = enabled
        self.jsonl = self.tb = self.bar = self.console = None
        if not enabled:
            return
        directory.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(directory / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.console = open(directory / "console.log", "a", encoding="utf-8")  # noqa: SIM115
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(directory / "tensorboard"))
        except ImportError:
            warnings.warn("tensorboard is not installed: no TensorBoard logs", stacklevel=2)
        from tqdm import tqdm

        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tb.add_scalar(key, value, record["step"])
            for kind, d in (record.get("communication") or {}).items():
                self.tb.add_scalar(f"communication/{kind}_seconds", d["seconds"], record["step"])
                self.tb.add_scalar(f"communication/{kind}_bytes", d["bytes"], record["step"])
        shown = (("loss", ".4f"), ("val_loss", ".4f"), ("lr", ".3e"), ("tokens_per_s", ".0f"),
                 ("device_hours", ".3g"), ("cost", ".3g"))  # fmt: skip
        fields = [
            f"{k} {record[k]:{f}}" for k, f in shown if isinstance(record.get(k), float | int)
        ]
        self._console(" ".join([f"step {record['step']}", *fields]))
        self.bar.update(record["step"] - self.bar.n)
        self.bar.set_postfix(
            loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False
        )

    def note(self, text: str) -> None:
        if self.enabled:
            (self.bar.write if self.bar else print)(text)
            self._console(text)

    def _console(self, text: str) -> None:
        self.console.write(text + "\n")
        self.console.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.bar.close()
        self.jsonl.close()
        self.console.close()
        if self.tb is not None:
            self.tb.close()
