"""Writes the gated copy of PyTorch's own distributed test suite (issue 18): the installed
wheel's ``torch/testing/_internal/distributed/distributed_test.py`` with every gate that admits
gloo admitting shardwise too, so the suite runs the gloo CPU tests against the shardwise backend.
Nothing of torch's file is kept in this repository; the copy goes to the folder given.

Run: python tests/conformance/gate.py build/conformance
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

GLOO_LIKE = '("gloo", "shardwise")'
# (pattern, replacement): the gates as torch writes them
GATES = [
    (r'BACKEND == "gloo"', f"BACKEND in {GLOO_LIKE}"),
    (r'BACKEND != "gloo"', f"BACKEND not in {GLOO_LIKE}"),
    (r'require_backend_is_available\(\{"gloo"\}\)', "require_backend_is_available("
     '{"gloo", "shardwise"})'),
    # the profiling allow-lists (collectives, CUDA collectives, send/recv), where gloo is listed
    (r"(\n(?:CUDA_|SEND_RECV_)?PROFILING_SUPPORTED_BACKENDS = \[\n(?:    .*\n)*?)"
     r"(    dist\.Backend\.GLOO,\n)", r'\1\2    "shardwise",\n'),
]  # fmt: skip
NAME = "shardwise_distributed_test.py"


def gate(source: str) -> tuple[str, dict[str, int]]:
    """The gated text and how many times each gate was rewritten."""
    counts = {}
    for pattern, replacement in GATES:
        source, counts[pattern] = re.subn(pattern, replacement, source)
    return source, counts


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    origin = Path(spec.origin)
    text, counts = gate(origin.read_text())
    if not all(counts.values()):
        missing = [p for p, n in counts.items() if n == 0]
        print(f"gate.py: {origin} no longer has the gates {missing}; update GATES", file=sys.stderr)
        return 1
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / NAME).write_text(f"# gated copy of {origin} (tests/conformance/gate.py)\n" + text)
    print(f"gate.py: {out / NAME}: " + ", ".join(f"{n}× {p}" for p, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
