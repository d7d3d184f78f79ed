"""The planner's tables for the released model families on clusters of H100s (docs/planning.md's
"Scale on paper"): per family and cluster size, the recommended strategy, its memory per GPU, its
predicted step and MFU, and the fastest strategy that fits.

Run: python scripts/plan_scale.py > docs/planning_scale.md
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("qwen2_0_5b", "gemma3_1b", "llama3_1b", "gemma3_4b", "llama3_8b")
GPUS = (8, 64, 512)
PER_HOST, MEMORY_GIB, DEVICE = 8, 80, "h100"


def plan_row(family: str, gpus: int) -> list[str]:
    from shardwise.train import config_plan, prediction
    from shardwise.train.calibration import GPUS as GPUS_NAMED
    from shardwise.train.cluster import Cluster
    from shardwise.train.config import load_config
    from shardwise.train.device import bf16_peak

    env = {"WORLD_SIZE": str(gpus), "LOCAL_WORLD_SIZE": str(PER_HOST)}
    config = str(ROOT / "examples" / "configs" / "fsdp.yaml")
    cfg = load_config(config, [f"model={family}"], env=env, cuda_devices=PER_HOST)
    cluster = Cluster(DEVICE, gpus // PER_HOST, PER_HOST, MEMORY_GIB)
    plan = config_plan.plan_for_config(cfg, MEMORY_GIB * 2**30)
    predicted = prediction.for_config(cfg, plan, DEVICE, cluster)
    rec = plan.recommendation
    if rec.row is None:
        return [family, str(gpus), "none fits", "", "", "", "", ""]
    time = predicted.times[rec.row.strategy]
    peak = bf16_peak(GPUS_NAMED[DEVICE])  # the data sheet's
    mfu = time.tokens_per_s / gpus * 6 * plan.params / peak if time else None
    fastest = predicted.ranking[0] if predicted.ranking else "?"
    return [
        family,
        str(gpus),
        rec.row.label,
        f"{rec.row.required / 2**30:.1f}",
        f"{time.step_s:.3g}" if time else "?",
        f"{time.tokens_per_s / gpus:.0f}" if time else "?",
        f"{mfu:.0%}" if mfu else "?",
        fastest,
    ]


def main() -> int:
    head = ["model", "H100s", "recommended", "GiB per GPU", "step s", "tokens/s per GPU", "MFU",
            "fastest that fits"]  # fmt: skip
    rows = [plan_row(f, g) for f in FAMILIES for g in GPUS]
    print(f"# Scale on paper: the planner on H100 clusters ({datetime.date.today()})\n")
    print(
        "`python scripts/plan_scale.py`: `examples/configs/fsdp.yaml` (bf16 parameters under\n"
        "FSDP's own mixed precision, activation checkpointing, AdamW, 4 sequences of 2048 tokens\n"
        "per GPU) with `model=NAME`, on hosts of 8 H100s (80 GiB, 360 GB/s within a host, 400\n"
        "GB/s per host link). Every figure is a prediction ([planning.md](planning.md)): memory\n"
        "from the ZeRO formulas and the model itself traced on fake tensors (its activation\n"
        "peak, in the config's bf16 parameters for every row); step time from data-sheet rates\n"
        "scaled by what one H200 measured (no H100 has run here), and each collective's latency\n"
        "from NCCL's ring model (its ring steps grow with the ranks: the DDP rows at 512 GPUs\n"
        "wait on their buckets' all-reduces; NCCL would pick a tree for some of them, so these\n"
        "rows are an upper bound). MFU: 6 x parameters x tokens/s over the bf16 data-sheet\n"
        "peak.\n"
    )
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
