"""What a device sustains, for the step-time model (``step_time.py``): matmul and attention
rates per dtype width and size, a memory bandwidth, a fixed cost per operator, what the
optimizer's update costs (per parameter and per tensor), and whether communication overlaps
compute.

Two sources, and every figure says which it rests on (``DeviceRates.source``):

- **this CPU, measured** the first time a plan asks for it, with the threads one rank of the
  planned run uses (the trainer gives each of a host's R ranks ``cores // R`` threads), then
  cached in ``$XDG_CACHE_HOME/shardwise/calibration.json`` (default ``~/.cache``) under the CPU's
  model name, the thread count, the torch version and ``CALIBRATION_VERSION`` (``measure_cpu``
  says what it runs, 20-75 s on a 2-core VM, in fresh interpreters: as many at once as the
  host's cores hold ranks of those threads, so every core is busy as in a run; each time the
  median of its repeats, as a run reports its median step; ``_measure_fresh``): matmuls of
  1024 tokens at widths 32-1024 (``MATMUL_SIZES``; small widths run far below the peak) in a
  training step's three layouts; attention forward and backward apart at 64-256 positions
  and head sizes 16-128 (``ATTENTION_SHAPES``: the rate follows positions x head size, the
  CPU's backward runs at a fraction of its forward's, bf16's at a third of it on short
  sequences); the cost per
  operator and the other operators' bandwidth from two small real training steps; the update
  as a step runs it (the global norm's clip, then the fused AdamW, ``_update_rates``): its
  parameters per second over 8 tensors of 1M parameters (beyond the caches, as a model's
  state is; a CPU's fused kernel need not run at the memory bandwidth) and its cost per tensor
  over 128 small ones; what a rank's resident set holds beyond its tensors
  (``resident.py``); and the latency of a collective's ring step and of a point-to-point
  message between two processes (``collective_latency.measure_cpu_step``). A cached entry is
  validated (every field a positive number of the expected kind) and measured afresh when not;
  delete the file to measure again.
- **GPUs, from data sheets and one measurement:** the dense bf16 peaks of ``device.BF16_PEAKS``
  and the vendors' memory bandwidths, each scaled by what the committed H200 runs measured
  (``benchmarks/results/2026-11-26-fsdp-gpu-h200.md``): an 8192^3 bf16 matmul ran at 805 of
  989 TFLOP/s (0.81 of peak), and GPT small's compute-only step (0.009 s for 330 operators at
  negligible roofline time) gives 27 us per operator of eager PyTorch. fp32 matmuls use TF32
  tensor cores at half the bf16 rate; fused attention is taken at 0.6 of the matmul rate
  (assumed, as FlashAttention-2 reports on these GPUs); the optimizer's update is taken as
  bound by the memory bandwidth (a fused kernel's bytes; not measured). Only the H200's figures
  are measured here; the others assume the same fractions.

On a GPU the collectives run beside the kernels (NCCL's own channels), so communication can hide
behind compute; on the CPU the shardwise backend's collectives copy with the same cores that
compute, so the model adds them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from . import resident
from .collective_latency import measure_cpu_step
from .device import bf16_peak

# H200's measured fractions (module docstring)
MATMUL_FRACTION = 805.0 / 989.4
GPU_OP_SECONDS = 27e-6
MEMORY_FRACTION = 0.8  # assumed: achievable STREAM-like bandwidth over the data sheet's
ATTENTION_FRACTION = 0.6  # assumed: fused attention's rate over the matmul rate (FlashAttention-2)

# Data-sheet memory bandwidths (bytes/s), by a substring of the device name; first match wins.
GPU_MEMORY_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("A100", 2.039e12),
    ("L40S", 0.864e12),
)
# bytes an AdamW update reads and writes per fp32 parameter (the one ``_update_rates`` times)
ADAMW_UPDATE_BYTES = 28
GPUS = {"h200": "H200", "h100": "H100", "a100": "A100", "l40s": "L40S"}


@dataclass(frozen=True)
class DeviceRates:
    """A device's sustained rates. ``matmul_flops``, ``attention_flops`` (forward) and
    ``attention_backward_flops`` map a dtype's itemsize (2: bf16 / fp16, 4: fp32) to a curve:
    FLOP/s at each measured size (a matmul's smallest dimension, an attention's positions x
    head size)."""

    name: str
    matmul_flops: dict[int, dict[int, float]]
    attention_flops: dict[int, dict[int, float]]
    attention_backward_flops: dict[int, dict[int, float]]
    memory_bytes_per_s: float
    op_seconds: float
    overlaps_communication: bool
    source: str
    # a CPU rank's resident set beyond its live tensors (``resident.Resident``); a GPU's
    # allocator counts its tensors alone (torch.cuda.max_memory_allocated)
    resident_base_bytes: int = 0
    resident_warmup_bytes: int = 0
    allocator_retention: float = 1.0
    # the optimizer's update as a step runs it (clip, then the fused AdamW in fp32 states):
    # parameters per second (0: bound by the memory bandwidth, ``update_seconds``) and the
    # fixed cost of each tensor it steps
    update_params_per_s: float = 0.0
    update_tensor_seconds: float = 0.0
    # a CPU's collective latency (``collective_latency.measure_cpu_step``): a ring step and a
    # point-to-point message between two ranks; 0 on a GPU (NCCL's table instead)
    collective_step_seconds: float = 0.0
    message_seconds: float = 0.0

    def update_seconds(self, params: float, tensors: int, update_bytes: int) -> float:
        """Seconds of an optimizer update of ``params`` parameters in ``tensors`` tensors, each
        parameter's update reading and writing ``update_bytes`` (``step_time.update_bytes``):
        at the measured rate, scaled by those bytes over AdamW's 28 (an optimizer that moves
        fewer bytes does less arithmetic too: assumed), plus each tensor's fixed cost; where
        the rate is not measured (a GPU), the bytes over the memory bandwidth."""
        if self.update_params_per_s <= 0:
            return params * update_bytes / self.memory_bytes_per_s
        per_param = update_bytes / ADAMW_UPDATE_BYTES / self.update_params_per_s
        return params * per_param + tensors * self.update_tensor_seconds

    def peak_memory_bytes(self, live_bytes: int) -> int:
        """A rank's peak memory when ``live_bytes`` of tensors are live at once: on the CPU its
        resident set (``resident.Resident.peak_bytes``), on a GPU the allocated bytes."""
        from .resident import Resident

        return Resident(
            self.resident_base_bytes, self.resident_warmup_bytes, self.allocator_retention
        ).peak_bytes(live_bytes)

    def flop_rate(self, kind: str, itemsize: int, size: int = 0) -> float:
        """FLOP/s of an operator of ``kind`` (``op_trace.OpCost.kind``) in a dtype of
        ``itemsize`` bytes (the fp32 curve for a width not measured) and ``size``: the curve
        interpolated in log2(size), its ends held beyond them (0: the largest size's)."""
        tables = {"attention": self.attention_flops, "attention_backward":
                  self.attention_backward_flops}  # fmt: skip
        table = tables.get(kind, self.matmul_flops)
        return _interpolate(table.get(itemsize) or table[4], size)


def _interpolate(curve: dict[int, float], size: int) -> float:
    points = sorted(curve.items())
    if size <= 0 or size >= points[-1][0]:
        return points[-1][1]
    if size <= points[0][0]:
        return points[0][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:], strict=False):
        if s0 <= size <= s1:
            f = (math.log2(size) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
            return r0 + f * (r1 - r0)
    return points[-1][1]


def device_key(name: str) -> str:
    """``cpu``, or the table's key (``h100``, ...) of a GPU named by key or by its CUDA device
    name (``NVIDIA H200``: the longest listed name it contains); ValueError for another."""
    if name.lower() in ("cpu", *GPUS):
        return name.lower()
    for key, full in sorted(GPUS.items(), key=lambda kv: -len(kv[1])):
        if full in name:
            return key
    raise ValueError(
        f"no published rates for the device {name!r}; name one of {', '.join(GPUS)} or "
        "'cpu' (this machine, measured)"
    )


def gpu_rates(name: str) -> DeviceRates:
    """The rates of a GPU by name (``h100``, ``h200``, ``a100``, ``l40s``, or a CUDA device
    name such as ``NVIDIA H200``)."""
    full = GPUS.get(name.lower(), name)
    peak = bf16_peak(full)
    memory = next((bw for key, bw in GPU_MEMORY_BANDWIDTH if key in full), None)
    if peak is None or memory is None:
        raise ValueError(
            f"no published rates for the device {name!r}; name one of {', '.join(GPUS)} or "
            "'cpu' (this machine, measured)"
        )
    bf16 = peak * MATMUL_FRACTION
    measured = "H200" in full
    matmul = {2: {1024: bf16}, 4: {1024: bf16 / 2}}  # one point: the large matmul's
    attention = {k: {1024: c[1024] * ATTENTION_FRACTION} for k, c in matmul.items()}
    return DeviceRates(
        full,
        matmul,
        attention,
        attention,
        memory * MEMORY_FRACTION,
        GPU_OP_SECONDS,
        True,
        "measured on an H200 (2026-11-26)" if measured else "data sheet x the H200's fractions",
    )


def _typical(run, repeats: int = 5) -> float:
    """Seconds of ``run``: the median of ``repeats`` after one warm-up. The median, not the
    best: a run's step is reported as its median (``step_s``), and on a shared host the best of
    many times runs 30-40% under it (a tiny GPT's forward + backward: 9.6 ms best, 13.7 ms
    median, one process on this 2-core VM)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


MATMUL_SIZES = (32, 64, 128, 256, 512, 1024)
# (positions, head size): an attention's curve is keyed by their product (op_trace._size)
ATTENTION_SHAPES = ((64, 16), (64, 32), (128, 32), (256, 32), (256, 64), (256, 128))
# what a cache entry was measured under; an entry of another version is measured again
CALIBRATION_VERSION = 11


def _matmul_flops(dtype: torch.dtype, size: int) -> float:
    """A transformer's shape, 1024 tokens x ``size`` features into 3 x ``size`` (1024 square at
    the largest size), in the three layouts one linear layer's training step runs: the forward
    ``x @ W^T``, the input's gradient ``g @ W`` and the weight's ``g^T @ x``. Their mean rate
    (three times the FLOPs over the three times): the CPU's bf16 kernels run the transposed
    left operand of the weight's gradient at about 0.6 of the others' rate."""
    m, n = 1024, 3 * size if size < 1024 else 1024
    x, w, g = (torch.randn(*shape).to(dtype) for shape in ((m, size), (n, size), (m, n)))
    layouts = (lambda: x @ w.t(), lambda: g @ w, lambda: g.t() @ x)
    return 3 * 2.0 * m * size * n / sum(_typical(layout) for layout in layouts)


def _memory_bandwidth(elements: int = 16 << 20) -> float:
    a, b, c = torch.ones(elements), torch.ones(elements), torch.empty(elements)
    return 3 * 4 * elements / _typical(lambda: torch.add(a, b, out=c))


def _attention_flops(dtype: torch.dtype, positions: int, head: int) -> tuple[float, float]:
    """Causal scaled-dot-product attention, 8 heads of ``head`` over ``positions`` in a batch of
    1024 positions in all, at torch's FLOP formulas: (forward FLOP/s, backward FLOP/s: forward +
    backward less the forward)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    shape = (max(1, 1024 // positions), 8, positions, head)
    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, dtype=dtype)

    def forward():
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    ahead, whole = _typical(forward), _typical(both)
    backward = max(whole - ahead, 1e-3 * whole)
    return (
        sdpa_flop_count(shape, shape, shape) / ahead,
        sdpa_backward_flop_count(shape, shape, shape, shape) / backward,
    )


def _calibration_step(cfg, micro_batch: int, repeats: int = 5):
    """(seconds of one real forward + backward of a GPT of ``cfg`` in fp32, the median of
    ``repeats``; its trace)."""
    from ..models.gpt import GPT
    from . import op_trace

    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = torch.zeros(micro_batch, cfg.seq_len, dtype=torch.long)
    seconds = _typical(lambda: model.loss(tokens, tokens).backward(), repeats=repeats)
    trace = op_trace.trace_training_step(lambda: GPT(cfg), tokens.shape, bf16=False)
    return seconds, trace


def _update_time(shapes, repeats: int) -> float:
    """Seconds of the update a step runs over fp32 parameters of ``shapes`` with gradients:
    ``clip_grad_norm_over_mesh`` (the global norm, then the scale) and the fused AdamW."""
    from .. import _C
    from ..optim import FusedAdamW

    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    for p in params:
        p.grad = torch.randn(p.shape)
    optimizer = FusedAdamW(params, lr=1e-3, weight_decay=0.1)
    grads = [p.grad for p in params]

    def update():
        _C.clip_grad_norm_over_mesh([], grads, [], 1.0, None, None, None)
        optimizer.step()

    return _typical(update, repeats)


def _update_rates(elements: int = 1 << 20, tensors: int = 128) -> tuple[float, float]:
    """(parameters per second of the update over 8 tensors of ``elements``: their state larger
    than the caches, as a model's is; seconds per tensor: ``tensors`` tensors of 256
    parameters, less their parameters at that rate)."""
    rate = 8 * elements / _update_time([(elements,)] * 8, repeats=5)
    small = _update_time([(16, 16)] * tensors, repeats=10)
    return rate, max(1e-7, (small - tensors * 256 / rate) / tensors)


def _memory_rate(rates: DeviceRates, seconds: float, trace) -> float:
    """The other operators' bandwidth (casts, softmax, norms, GELU, adds: their bytes over their
    time) that makes ``trace`` take the measured ``seconds`` after its matmuls, attention and
    dispatch (at ``rates``) are subtracted; ``rates``' own where nothing is left."""
    computed = trace.roofline_seconds(rates, ("matmul", "attention", "attention_backward"))
    left = seconds - computed - rates.op_seconds * len(trace)
    return trace.bytes_of("memory") / left if left > 0 else rates.memory_bytes_per_s


def measure_cpu(threads: int, host_figures: bool = True) -> DeviceRates:
    """This CPU's rates with ``threads`` threads (restored after). The matmul and attention
    rates come from those kernels alone; the cost per operator from a 2-layer, 64-wide GPT on 8
    tokens (its time is almost all dispatch: its roofline is subtracted); the memory
    bandwidth of the other operators (casts, softmax, norms, GELU, adds: their bytes over their
    time) from a 2-layer, 256-wide GPT on 512 tokens, after its matmuls, attention and
    dispatch are subtracted. ``host_figures``: also the resident set and the collective
    latency, which need no peers beside them (``_measure_fresh``); else those are 0."""
    from ..models.gpt import GPTConfig

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtypes = {4: torch.float32, 2: torch.bfloat16}
        matmul = {k: {s: _matmul_flops(d, s) for s in MATMUL_SIZES} for k, d in dtypes.items()}
        heads = {
            k: {n * h: _attention_flops(d, n, h) for n, h in ATTENTION_SHAPES}
            for k, d in dtypes.items()
        }
        attention = {k: {s: r[0] for s, r in c.items()} for k, c in heads.items()}
        backward = {k: {s: r[1] for s, r in c.items()} for k, c in heads.items()}
        bandwidth = _memory_bandwidth()
        rates = DeviceRates("cpu", matmul, attention, backward, bandwidth, 0.0, False, "")
        tiny = GPTConfig(vocab_size=64, seq_len=8, dim=64, layers=2, heads=2)
        seconds, trace = _calibration_step(tiny, 1, repeats=25)  # ms each: the median of many
        op = max(1e-7, (seconds - trace.roofline_seconds(rates)) / len(trace))
        rates = replace(rates, op_seconds=op)
        mid = GPTConfig(vocab_size=4096, seq_len=256, dim=256, layers=2, heads=4)
        memory = _memory_rate(rates, *_calibration_step(mid, 2, repeats=10))
        when = time.strftime("%Y-%m-%d")
        source = f"measured on this CPU ({threads} threads, {when})"
        update_rate, update_tensor = _update_rates()
        held = resident.measure_fresh(threads) if host_figures else resident.Resident(0, 0, 1.0)
        step, message = measure_cpu_step() if host_figures else (0.0, 0.0)
        return DeviceRates(
            "cpu", matmul, attention, backward, memory, op, False, source,
            held.base_bytes, held.warmup_bytes, held.retention, update_rate, update_tensor,
            step, message,
        )  # fmt: skip
    finally:
        torch.set_num_threads(before)


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardwise" / "calibration.json"


def _cpu_key(threads: int, figure: str = "") -> str:
    """A cache entry's key: this CPU, the figure (default: the rates at ``threads``), torch and
    the calibration's version."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    figure = figure or f"{threads} threads"
    return f"{model} | {figure} | torch {torch.__version__} | v{CALIBRATION_VERSION}"


def _rates_table(entry, key: str) -> dict[int, dict[int, float]]:
    table = {int(k): {int(s): float(r) for s, r in c.items()} for k, c in entry[key].items()}
    rates = [r for c in table.values() for r in c.values()]
    if set(table) != {2, 4} or not all(table.values()) or not all(r > 0 for r in rates):
        raise ValueError(key)
    return table


def _from_cache(entry, host_figures: bool = True) -> DeviceRates | None:
    """The rates a cache entry holds, or None where any field is missing or out of range (a
    peer's, without ``host_figures``, holds no resident set or latency: ``measure_cpu``)."""
    try:
        memory, op = float(entry["memory_bytes_per_s"]), float(entry["op_seconds"])
        base, warmup = int(entry["resident_base_bytes"]), int(entry["resident_warmup_bytes"])
        retention = float(entry["allocator_retention"])
        update = float(entry["update_params_per_s"])
        update_tensor = float(entry["update_tensor_seconds"])
        step, message = float(entry["collective_step_seconds"]), float(entry["message_seconds"])
        if memory <= 0 or op <= 0 or update <= 0 or update_tensor <= 0:
            return None
        held = base > 0 and warmup >= 0 and 1.0 <= retention < 4.0 and step > 0 and message > 0
        if host_figures and not held:
            return None
        return DeviceRates(
            "cpu",
            _rates_table(entry, "matmul_flops"),
            _rates_table(entry, "attention_flops"),
            _rates_table(entry, "attention_backward_flops"),
            memory,
            op,
            False,
            str(entry.get("source", "measured on this CPU")),
            base,
            warmup,
            retention,
            update,
            update_tensor,
            step,
            message,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _cached(key: str, parse, measure):
    """The cache file's entry ``key`` as ``parse`` reads it (None: missing or invalid), else
    ``measure()``, stored under ``key`` (a ``DeviceRates`` as its fields)."""
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    found = parse(cached.get(key))
    if found is not None:
        return found
    found = measure()
    cached[key] = asdict(found) if isinstance(found, DeviceRates) else found
    try:
        from ..atomic_file import atomic_write

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(json.dumps(cached, indent=1).encode()))
    except OSError:
        pass  # an unwritable cache only costs the next plan a new measurement
    return found


def cpu_rates(threads: int) -> DeviceRates:
    """This CPU's rates for ranks of ``threads`` threads: cached, else measured and cached."""
    return _cached(_cpu_key(threads), _from_cache, lambda: _measure_fresh(threads))


def _penalty(entry) -> float | None:
    try:
        return float(entry) if 1.0 <= float(entry) < 10.0 else None
    except (TypeError, ValueError):
        return None


def oversubscription_penalty() -> float:
    """How much slower than its turns a rank computes once a host's ranks outnumber its cores
    (``oversubscription.py``): cached beside the rates, else measured (about 20 s) and cached;
    only a plan of more ranks than cores asks (``prediction.for_gpt``)."""
    from . import oversubscription

    return _cached(_cpu_key(1, "oversubscription"), _penalty, oversubscription.measure)


def calibration_peers(threads: int, cores: int | None = None) -> int:
    """How many calibrations run at once: as many ranks of ``threads`` threads as the host's
    cores hold, as a run fills them (``device.cpu_threads_per_rank``). Beyond the cores ranks
    take turns, which ``step_time.cpu_contention`` prices apart."""
    from .device import host_cores

    return max(1, (cores or host_cores()) // threads)


def _measure_fresh(threads: int) -> DeviceRates:
    """``measure_cpu`` in new interpreters: the models it trains must not stay in the resident
    set of the process that asked (a training rank reports its peak RSS). ``calibration_peers``
    of them measure at once, released together once all are imported, so each figure is taken
    with every core busy, as a run's ranks keep them (two 1-thread ranks on this 2-core VM ran a
    DDP tiny forward 1.3-2x slower than one 2-thread rank); the figures are their mean, and the
    first alone measures the resident set and the collective latency afterwards."""
    import sys

    from .together import run_together

    command = [sys.executable, "-m", "shardwise.train.calibration", str(threads)]
    roles = ["host"] + ["peer"] * (calibration_peers(threads) - 1)
    done = run_together([[*command, role] for role in roles], timeout=600)
    found = [
        _from_cache(json.loads(d.stdout.strip().splitlines()[-1]), host_figures=i == 0)
        if d.ok and d.stdout.strip() else None
        for i, d in enumerate(done)
    ]  # fmt: skip
    if any(rates is None for rates in found):
        failed = next(i for i, rates in enumerate(found) if rates is None)
        raise RuntimeError(f"calibrating this CPU failed (peer {failed}):\n{done[failed].stderr}")
    return _mean(found)


def _mean(peers: list[DeviceRates]) -> DeviceRates:
    """The peers' figures averaged; the resident set and the latency are the first's."""

    def curves(field):
        tables = [getattr(r, field) for r in peers]
        return {k: {s: statistics.fmean(t[k][s] for t in tables) for s in c} for k, c in
                tables[0].items()}  # fmt: skip

    def mean(field):
        return statistics.fmean(getattr(r, field) for r in peers)

    return replace(
        peers[0],
        matmul_flops=curves("matmul_flops"),
        attention_flops=curves("attention_flops"),
        attention_backward_flops=curves("attention_backward_flops"),
        memory_bytes_per_s=mean("memory_bytes_per_s"),
        op_seconds=mean("op_seconds"),
        update_params_per_s=mean("update_params_per_s"),
        update_tensor_seconds=mean("update_tensor_seconds"),
        source=f"{peers[0].source[:-1]}, {len(peers)} at once)",
    )


def rates_for(device: str, threads: int = 1) -> DeviceRates:
    """``cpu`` (this machine, ``threads`` per rank) or a GPU (``gpu_rates``)."""
    return cpu_rates(threads) if device_key(device) == "cpu" else gpu_rates(device)


if __name__ == "__main__":
    import sys

    from .together import wait_for_go

    wait_for_go()  # imported: wait for the other peers (``_measure_fresh``)
    rates = measure_cpu(int(sys.argv[1]), host_figures=sys.argv[2:] != ["peer"])
    print(json.dumps(asdict(rates)))
