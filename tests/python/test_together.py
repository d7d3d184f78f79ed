"""Processes released together (``train/together.py``), as the calibration's peers and the
oversubscription probe's workers run."""

import sys
import time

from shardwise.train.together import run_together

WORKER = """
import sys, time
from shardwise.train.together import wait_for_go
time.sleep(float(sys.argv[1]))  # a slow import
wait_for_go()
print(time.time())
"""


def test_no_process_starts_its_work_before_the_slowest_is_ready():
    """A worker whose import takes 1.5 s holds the other back: both start after it is ready
    (a calibration peer that ran ahead would measure an idle core)."""
    before = time.time()
    done = run_together([[sys.executable, "-c", WORKER, s] for s in ("0", "1.5")], timeout=60)
    assert all(d.ok for d in done)
    started = [float(d.stdout.split()[-1]) for d in done]
    assert min(started) >= before + 1.5
    assert max(started) - min(started) < 1.0


def test_a_process_that_fails_before_ready_is_reported_with_its_error():
    """A worker that dies importing is not ok and its stderr comes back; the others still run."""
    failing = [sys.executable, "-c", "raise SystemExit('no such model')"]
    done = run_together([failing, [sys.executable, "-c", WORKER, "0"]], timeout=60)
    assert not done[0].ok and "no such model" in done[0].stderr
    assert done[1].ok
