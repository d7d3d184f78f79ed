"""What a CPU rank's resident set holds besides its live tensors, measured once per machine for
the planner's peak-RSS prediction (``prediction.py``), in a fresh interpreter so that nothing the
asking process did counts (``python -m shardwise.train.resident`` prints the three figures):

- ``base_bytes``: the resident set once torch and shardwise's trainer are imported;
- ``warmup_bytes``: what a rank's first training step adds beyond its tensors, measured on a
  2-layer, 64-wide GPT whose tensors are a few KiB: the kernels' code paged in (oneDNN's and
  the BLAS's), the intra-op thread pool's stacks and the allocator's first arenas;
- ``retention``: the resident set's growth over ten steps of a 2-layer, 256-wide GPT on 2048
  tokens (AdamW) over the bytes live at its peak (parameters, gradients, two moments and the
  traced activation peak, ``gpt_costs._peak_bytes``): freed activations the C allocator keeps
  mapped for reuse (glibc returns only blocks above its mmap threshold, at most 32 MiB).

A rank's peak RSS is then ``base + warmup + retention x its live bytes``."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Resident:
    base_bytes: int
    warmup_bytes: int
    retention: float

    def peak_bytes(self, live_bytes: int) -> int:
        return int(self.base_bytes + self.warmup_bytes + self.retention * live_bytes)


def _current() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _train(cfg, batch: int, steps: int) -> int:
    """Train a fresh GPT of ``cfg`` for ``steps`` steps; its live bytes at the peak."""
    import torch

    from ..models.gpt import GPT
    from ..optim import FusedAdamW
    from .gpt_costs import _peak_bytes

    torch.manual_seed(0)
    model = GPT(cfg)
    optimizer = FusedAdamW(model.parameters(), lr=1e-3)
    tokens = torch.zeros(batch, cfg.seq_len, dtype=torch.long)
    for _ in range(steps):
        model.loss(tokens, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    states = 16 * sum(p.numel() for p in model.parameters())  # fp32 param, grad, 2 moments
    return states + _peak_bytes(cfg, batch, False)


def measure() -> Resident:
    """The three figures, in this process (which must be fresh: see the module docstring)."""
    from ..models.gpt import GPTConfig
    from . import trainer  # noqa: F401  (what a rank imports)
    from .metrics import peak_rss_bytes

    base = _current()
    _train(GPTConfig(vocab_size=64, seq_len=8, dim=64, layers=2, heads=2), 1, 2)
    warm = peak_rss_bytes()
    live = _train(GPTConfig(vocab_size=4096, seq_len=256, dim=256, layers=2, heads=4), 8, 10)
    grown = peak_rss_bytes() - warm
    return Resident(base, max(0, warm - base), max(1.0, grown / live))


def measure_fresh(threads: int) -> Resident:
    """``measure`` in a new interpreter with ``threads`` intra-op threads."""
    import os

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, "-m", "shardwise.train.resident"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"measuring the resident set failed:\n{done.stderr[-2000:]}")
    return Resident(**json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    from dataclasses import asdict

    print(json.dumps(asdict(measure())))
