"""Every rank on the same kind of device, checked once at start ("devices are not homogeneous":
the slowest or smallest device sets the pace and the memory plan of all).

Each rank describes its device (``describe``): on a GPU its name, compute capability and
memory; on the CPU the processor's model and the cores this machine has. ``check`` compares the
descriptions every rank gathered: a difference is an error naming each field that differs and
which ranks have which value, unless ``training.allow_mixed_devices`` lets the run go on with a
warning. ``CUDA_VISIBLE_DEVICES`` (torch honours it: device ``cuda:i`` is the i-th visible one)
is part of each rank's description and of the start line, but not compared: ranks on one node
see different devices by design."""

from __future__ import annotations

import os
import platform

import torch

COMPARED = ("kind", "name", "capability", "memory_gib", "cores")


class DeviceMismatchError(RuntimeError):
    """The ranks' devices differ, and ``training.allow_mixed_devices`` is off."""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device) -> dict:
    """This rank's device, as ``check`` compares it."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "kind": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cores": None,
            "index": device.index,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    return {
        "kind": "cpu",
        "name": _cpu_model(),
        "capability": None,
        "memory_gib": None,
        "cores": os.cpu_count(),
        "index": None,
        "visible": None,
    }


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def differences(descriptions: list[dict]) -> list[str]:
    """One line per compared field whose value is not every rank's: each value with its ranks."""
    lines = []
    for field in COMPARED:
        holders: dict = {}
        for rank, description in enumerate(descriptions):
            holders.setdefault(description.get(field), []).append(rank)
        if len(holders) > 1:
            parts = [f"{_ranks(ranks)}: {value!r}" for value, ranks in holders.items()]
            lines.append(f"{field} differs ({'; '.join(parts)})")
    return lines


def check(descriptions: list[dict], allow_mixed: bool) -> str | None:
    """None when every rank's device is alike; else the warning to log when mixed devices are
    allowed, or DeviceMismatchError naming what differs and the fix."""
    lines = differences(descriptions)
    if not lines:
        return None
    text = "the ranks' devices differ: " + "; ".join(lines)
    if not allow_mixed:
        raise DeviceMismatchError(
            f"{text}. Run every rank on the same kind of device, or set "
            "training.allow_mixed_devices: true to go on"
        )
    return f"warning: {text} (training.allow_mixed_devices)"


def start_line(descriptions: list[dict]) -> str:
    """The start-of-run line: the device kind, and each rank's device (with the visible list)."""
    first = descriptions[0]
    what = first["name"] + (f" (sm {first['capability']})" if first["capability"] else "")
    if first["kind"] == "cuda":
        places = ", ".join(
            f"{r}: cuda:{d['index']} of CUDA_VISIBLE_DEVICES={d['visible'] or 'all'}"
            for r, d in enumerate(descriptions)
        )
        return f"devices: {len(descriptions)} x {what}; {places}"
    processes = "process" if len(descriptions) == 1 else "processes"
    return f"devices: {len(descriptions)} CPU {processes} on {what} ({first['cores']} cores)"
