"""A CPU rank's resident set beyond its tensors (``train/resident.py``) and the peak-RSS reading
every run record uses (``metrics.peak_rss_bytes``)."""

import os
import subprocess
import sys

from shardwise.train import metrics, resident
from shardwise.train.calibration import DeviceRates


def test_a_child_of_a_large_process_reports_its_own_peak():
    """Linux carries getrusage's ru_maxrss over an exec from the spawning process: a rank
    started by a process holding 400 MiB reported at least 400 MiB whatever it held (the
    calibration's own measurement once read its parent's peak as its warm-up). The record's
    reading is the child's memory map's high-water mark."""
    ballast = bytearray(400 * 2**20)  # touched: resident in this process
    ballast[::4096] = b"x" * len(ballast[::4096])
    code = "from shardwise.train import metrics; print(metrics.peak_rss_bytes())"
    child = int(subprocess.check_output([sys.executable, "-c", code], text=True))
    assert metrics.peak_rss_bytes() > 400 * 2**20
    assert child < metrics.peak_rss_bytes() - 300 * 2**20, (child, metrics.peak_rss_bytes())
    del ballast


def test_the_measured_resident_set_predicts_another_model_s_peak():
    """The three figures (torch and the trainer imported, the first step's code and arenas,
    the allocator's retention), measured in a child on its 256-wide GPT, must predict the peak
    resident set of another fresh process training GPT small (512 wide, 500 MiB live) within
    10%. Catches figures read in a process that is not fresh (a child's ru_maxrss once
    carried its parent's peak) and a retention that does not carry to another model."""
    held = resident.measure_fresh(1)
    assert 100 * 2**20 < held.base_bytes < 4 * 2**30
    assert 0 <= held.warmup_bytes < 2**30 and held.retention < 4.0
    code = (
        "from shardwise.train import trainer, resident, metrics\n"
        "from shardwise.models.gpt import PRESETS\n"
        "live = resident._train(PRESETS['small'], 2, 3)\n"
        "print(live, metrics.peak_rss_bytes())"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.check_output([sys.executable, "-c", code], text=True, env=env)
    live, peak = map(int, out.split()[-2:])
    assert abs(held.peak_bytes(live) - peak) <= 0.10 * peak, (held, live, peak)


def test_a_gpu_counts_its_tensors_alone():
    """On a GPU the peak is torch.cuda.max_memory_allocated: the live bytes, no resident set."""
    rates = DeviceRates("gpu", {4: {1: 1.0}}, {4: {1: 1.0}}, {4: {1: 1.0}}, 1.0, 1e-6, True, "")
    assert rates.peak_memory_bytes(12345) == 12345
