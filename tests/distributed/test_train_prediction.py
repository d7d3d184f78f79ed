"""``shardwise-train``'s own prediction against its own run on this machine: the step time and
peak RSS the planner predicts at the start (``prediction.for_config``, this CPU's calibration)
and what the run measures, as its summary line states them. Two short configs are asserted to
the planner's tolerances: peak RSS within 10% always, the step within 15% under
``make test-prediction`` (``SHARDWISE_TEST_STEP_TIME=1``). ``make test`` does not time steps: the
same DDP tiny run measured +7% on one machine and +59% on another (whose own calibration priced
a tiny micro-batch at 10.5 ms where it took 19 ms), and a CI verdict may not hang on the host
it drew. The other example configs are a benchmark (``make bench-planner``:
``benchmarks/bench_step_time.py``)."""

import importlib.util
import os
import re
from pathlib import Path

import pytest
import train_runs
from shardwise.train import calibration
from shardwise.train.device import cpu_threads_per_rank

_SPEC = importlib.util.spec_from_file_location(
    "later_builds", Path(__file__).resolve().parents[2] / "scripts" / "later_builds.py"
)
later_builds = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(later_builds)

STEP_TOLERANCE = 0.15
RSS_TOLERANCE = 0.10
TIMES_STEPS = os.environ.get("SHARDWISE_TEST_STEP_TIME") == "1"  # make test-prediction
LINE = re.compile(
    r"step time: predicted ([0-9.e+-]+) s, measured ([0-9.e+-]+) s .*?; "
    r"peak RSS: predicted ([0-9.]+) MiB, measured ([0-9.]+) MiB"
)
RUNS = {
    # name: (config, overrides): the tiny preset (a 19 ms step, dispatch-bound) and GPT small
    # (1.5 s, compute-bound), fp32 as the tests' runs are
    "ddp_tiny": ("ddp.yaml", []),
    "ddp_small": ("ddp.yaml", ["model.preset=small", "training.micro_batch_size=2"]),
}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A cache of this CPU's calibration made now, on a quiet machine, for the threads each of
    the runs' 2 ranks gets: not one a rank made earlier in the suite while other work ran."""
    cache = tmp_path_factory.mktemp("calibration")
    with pytest.MonkeyPatch.context() as patch, later_builds.quiet():
        patch.setenv("XDG_CACHE_HOME", str(cache))
        calibration.cpu_rates(cpu_threads_per_rank(2))
    return cache


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_takes_the_step_and_the_memory_it_predicts(name, calibrated, tmp_path, monkeypatch):
    """Two ranks, 8 steps (train_runs' fp32 runs); the largest rank's peak RSS against the
    predicted one and (``make test-prediction``) the summary's median step after the first
    against the start's prediction.
    Catches a cost model that prices an operator kind at another's rate (bf16 attention once at
    fp32's, 4x too fast on short sequences) and a memory model that drops what a rank holds
    beyond its model state (the first step's code and arenas, the logits' gradient, DDP's
    buckets: GPT small's rank was once predicted 20% under its resident set). The calibration
    is itself a measurement (its fitted bandwidth moves about 10% between calibrations), so a
    run outside the tolerances is run once more under a calibration of its own; the test fails
    when both are outside. Under `make test` the background build lane is held meanwhile
    (``later_builds.quiet``): a compiler beside a 2-rank run on 2 cores once made a DDP tiny
    step 60% slower than its prediction."""
    # fresh processes, as torchrun starts them: a rank forked from the tests' pool shares the
    # pool's pages and never counts them in its resident set (it measured 300 MiB less)
    monkeypatch.setenv("SHARDWISE_TEST_FRESH", "1")
    config, overrides = RUNS[name]
    misses = []
    for attempt, cache in enumerate([calibrated, tmp_path / "cache"]):
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        with later_builds.quiet():
            calibration.cpu_rates(cpu_threads_per_rank(2))  # the retry's own, on a quiet machine
            _, log = train_runs.train(
                2, config, tmp_path / f"{name}-{attempt}", "training.max_steps=8",
                "training.warmup_steps=1", "training.eval_every=0",
                "training.checkpoint.every_steps=1000", *overrides, timeout=300,
            )  # fmt: skip
        found = LINE.search(log)
        assert found, log[-3000:]
        step_p, step_m, rss_p, rss_m = map(float, found.groups())
        print(found.group(0))  # the step's error too, where it is not asserted
        step_ok = abs(step_m - step_p) <= STEP_TOLERANCE * step_p or not TIMES_STEPS
        if step_ok and abs(rss_m - rss_p) <= RSS_TOLERANCE * rss_p:
            return
        misses.append(found.group(0))
    asserted = f"step {STEP_TOLERANCE:.0%} / " if TIMES_STEPS else ""
    raise AssertionError(f"outside {asserted}RSS {RSS_TOLERANCE:.0%}: {misses}")
