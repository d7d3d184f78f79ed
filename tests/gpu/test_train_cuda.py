"""shardwise-train on the GPU for a few steps (FSDP, bf16 autocast on cuda:0, the data-sheet
peak for MFU): catches the trainer placing anything on the CPU, the pinned non-blocking batch
copy, and GPU memory metrics that are missing or zero."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_shardwise_train_runs_on_cuda(tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "shardwise.train",
        "--config",
        str(ROOT / "examples" / "configs" / "fsdp.yaml"),
        "model.preset=tiny",
        "training.device=cuda",
        "training.mixed_precision=bf16",
        "training.max_steps=6",
        "training.warmup_steps=1",
        "training.log_every=1",
        f"training.checkpoint.dir={out}",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 6
    last = records[-1]
    assert last["gpu_peak_mb_per_rank"][0] > 0, last
    assert records[0]["loss"] > last["loss"], records
