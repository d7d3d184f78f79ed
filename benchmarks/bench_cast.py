"""Cast bandwidth: shardwise's float32 -> bfloat16 kernels beside PyTorch's, one thread.

GB/s counts bytes read + written (6 bytes per element for fp32 -> bf16; 8 for a float32 copy),
from the median of torch.utils.benchmark's blocked_autorange. Every row also checks that the
shardwise output equals ``x.to(torch.bfloat16)`` bit for bit (the ``wrong`` column).

Columns:
- ``to()``: ``x.to(torch.bfloat16)`` (allocates its output) -- the anchor;
- ``cast``: ``shardwise.cast(x, torch.bfloat16)`` (allocates too), with the default kernel;
- ``copy_ cvt``: ``out.copy_(x)`` into a preallocated bf16 tensor (torch's converting copy);
- ``multi_cast_ <isa>``: ``shardwise.multi_cast_([x], [out])`` into the same preallocated tensor,
  per CPU kernel;
- ``copy``: a plain float32 ``y.copy_(x)`` of the same input, the memory-bandwidth yardstick.

On ``--device cuda`` the same columns run on the GPU (the CUDA kernel in place of the CPU
ones; Timer synchronizes the device around each measurement).

Run: python benchmarks/bench_cast.py --output benchmarks/results/DATE-cast-cpu.md
     python benchmarks/bench_cast.py --device cuda --output benchmarks/results/DATE-cast-gpu.md
"""

import argparse
import datetime
import platform
import subprocess
import sys

import shardwise
import torch
from torch.utils.benchmark import Timer

ISAS = ["scalar", "avx512", "avx512_bf16"]


def gbps(bytes_moved: int, stmt: str, env: dict, min_time: float) -> float:
    timer = Timer(stmt=stmt, globals=env, num_threads=1)
    return bytes_moved / timer.blocked_autorange(min_run_time=min_time).median / 1e9


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(
            line.split(":", 1)[1].strip()
            for line in out.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, StopIteration, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return cpu_model()


def measure(numel: int, isas: list[str], min_time: float, device: torch.device) -> dict:
    x = torch.randn(numel, device=device)
    out = torch.empty(numel, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    env = {"x": x, "out": out, "y": y, "torch": torch, "shardwise": shardwise}
    cast_bytes = numel * 6
    row = {
        "to()": gbps(cast_bytes, "x.to(torch.bfloat16)", env, min_time),
        "cast": gbps(cast_bytes, "shardwise.cast(x, torch.bfloat16)", env, min_time),
        "copy_ cvt": gbps(cast_bytes, "out.copy_(x)", env, min_time),
    }
    ref = x.to(torch.bfloat16).view(torch.int16)
    wrong = int((shardwise.cast(x, torch.bfloat16).view(torch.int16) != ref).sum())
    for isa in isas:
        if device.type == "cpu":
            shardwise.set_cpu_isa(isa)
        row[f"multi_cast_ {isa}"] = gbps(
            cast_bytes, "shardwise.multi_cast_([x], [out])", env, min_time
        )
        wrong += int((out.view(torch.int16) != ref).sum())
    if device.type == "cpu":
        shardwise.set_cpu_isa(None)
    row["copy"] = gbps(numel * 8, "y.copy_(x)", env, min_time)
    row["wrong"] = wrong
    return row


def human(nbytes: int) -> str:
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if nbytes < 1024:
            return f"{nbytes} {unit}"
        nbytes //= 1024
    return f"{nbytes} TiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min-bytes", type=int, default=4 << 10, help="smallest fp32 input")
    parser.add_argument("--max-bytes", type=int, default=256 << 20, help="largest fp32 input")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--output", help="write the markdown table here too")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes or args.factor < 2:
        parser.error("need 4 <= --min-bytes <= --max-bytes and --factor >= 2")

    torch.set_num_threads(1)
    isas = (
        ISAS[: ISAS.index(shardwise.detected_cpu_isa()) + 1] if device.type == "cpu" else ["cuda"]
    )
    columns = ["to()", "cast", "copy_ cvt"] + [f"multi_cast_ {i}" for i in isas] + ["copy"]
    lines = [
        f"# fp32 -> bf16 cast bandwidth on {device.type}, one CPU thread "
        f"({datetime.date.today().isoformat()})",
        "",
        f"- machine: {machine(device)}, torch {torch.__version__}, torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, shardwise default kernel "
        f"{shardwise.detected_cpu_isa()}",
        f"- command: `python benchmarks/bench_cast.py {' '.join(sys.argv[1:])}`",
        "- GB/s = (bytes read + bytes written) / median time; `copy` is a float32 copy of the "
        "same input; ratios: best shardwise (cast or multi_cast_) / `to()`, and best "
        "shardwise / `copy`",
        "",
        "| fp32 input | "
        + " | ".join(f"{c} GB/s" for c in columns)
        + " | vs to() | vs copy | wrong |",
        "|---|" + "---:|" * (len(columns) + 3),
    ]
    print("\n".join(lines), flush=True)
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        row = measure(nbytes // 4, isas, args.min_time, device)
        best = max(v for k, v in row.items() if k == "cast" or k.startswith("multi_cast_"))
        line = (
            f"| {human(nbytes)} | "
            + " | ".join(f"{row[c]:.1f}" for c in columns)
            + f" | {best / row['to()']:.2f}x | {best / row['copy']:.0%} | {row['wrong']} |"
        )
        print(line, flush=True)
        lines.append(line)
        nbytes *= args.factor
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
