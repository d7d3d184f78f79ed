"""A rank's slowdown once a host's ranks outnumber its cores (``train/oversubscription.py``), its
cache (``calibration.oversubscription_penalty``), and the calibration's peers measured at once
(``calibration._measure_fresh``'s ``calibration_peers`` and ``_mean``)."""

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from shardwise.train import calibration, oversubscription, prediction, step_time
from shardwise.train.plan_cli import main

DDP = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "ddp.yaml")

ATTENTION = {4: {64: 5e11}, 2: {64: 1e12}}
RATES = calibration.DeviceRates(
    "cpu", {4: {64: 1e12}, 2: {64: 2e12}}, ATTENTION, ATTENTION, 1e11, 1e-5, False,
    "measured (1 threads)", 2**29, 2**27, 1.2, 1e8, 1e-5, 5e-6, 8e-5,
)  # fmt: skip


def test_turns_beyond_the_cores_pay_the_penalty_blended_in_up_to_two():
    """Up to the cores nothing waits; at 2 turns the measured penalty applies in full (the
    point it is measured at), between 1 and 2 linearly, beyond 2 held."""
    assert oversubscription.contention(0.5, 1.3) == 1.0
    assert oversubscription.contention(1.0, 1.3) == 1.0
    assert oversubscription.contention(1.5, 1.2) == pytest.approx(1.5 * 1.1)
    assert oversubscription.contention(2.0, 1.2) == pytest.approx(2.4)
    assert oversubscription.contention(4.0, 1.2) == pytest.approx(4.8)
    assert step_time.cpu_contention(4, 1, cores=2, penalty=1.25) == pytest.approx(2.5)
    assert step_time.cpu_contention(2, 1, cores=2, penalty=1.25) == 1.0


def test_the_probe_s_pair_runs_the_same_collectives_to_the_end():
    """The real probe's workers, shortened: a pair all-reducing on the shardwise backend
    finishes and reports its iteration (a pair that decided apart when to stop once ran
    unequal collectives and failed, as a mismatched collective)."""
    assert oversubscription._median_iteration(2, seconds=0.3) > 0


def test_the_penalty_is_the_oversubscribed_iteration_over_its_two_turns(monkeypatch):
    """``2 * cores`` workers against ``cores``: their ratio over 2, never below 1 (a host
    whose turns cost nothing extra is priced at its turns alone)."""
    medians = {}
    monkeypatch.setattr(oversubscription, "_median_iteration", lambda w, s: medians[w])
    medians.update({2: 0.01, 4: 0.03})
    assert oversubscription.measure(cores=2, seconds=0.1) == pytest.approx(1.5)
    medians.update({2: 0.01, 4: 0.015})
    assert oversubscription.measure(cores=2, seconds=0.1) == 1.0


def test_the_penalty_is_cached_and_an_invalid_one_measured_again(tmp_path, monkeypatch):
    """Measured once per CPU and torch, beside the rates; a value below 1 (faster than its
    turns) is not trusted."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(oversubscription, "measure", lambda: measured.append(1) or 1.3)
    assert calibration.oversubscription_penalty() == 1.3
    assert calibration.oversubscription_penalty() == 1.3 and measured == [1]
    path = tmp_path / "shardwise" / "calibration.json"
    cached = json.loads(path.read_text())
    (key,) = cached
    assert "oversubscription" in key
    path.write_text(json.dumps({key: 0.5}))
    assert calibration.oversubscription_penalty() == 1.3 and measured == [1, 1]


def test_calibration_peers_fill_the_cores_and_their_mean_keeps_the_first_s_host_figures():
    """As many peers as ranks of those threads fit the cores; the curves and rates are their
    mean, the resident set and the latency (measured by the first alone) its own."""
    assert calibration.calibration_peers(1, cores=2) == 2
    assert calibration.calibration_peers(2, cores=2) == 1
    assert calibration.calibration_peers(4, cores=2) == 1
    peer = replace(
        RATES, matmul_flops={4: {64: 3e12}, 2: {64: 2e12}}, op_seconds=3e-5, resident_base_bytes=0,
        resident_warmup_bytes=0, allocator_retention=1.0, collective_step_seconds=0.0,
        message_seconds=0.0,
    )  # fmt: skip
    mean = calibration._mean([RATES, peer])
    assert mean.matmul_flops == {4: {64: 2e12}, 2: {64: 2e12}}
    assert mean.op_seconds == pytest.approx(2e-5)
    assert mean.resident_base_bytes == 2**29 and mean.message_seconds == 8e-5
    assert mean.source == "measured (1 threads, 2 at once)"


def test_a_peer_s_entry_needs_no_host_figures_but_the_first_s_does():
    """A peer measures no resident set or latency (zeros); the same entry as the host's would
    price every collective at 0 s, so it is refused there."""
    entry = asdict(replace(RATES, resident_base_bytes=0, message_seconds=0.0))
    assert calibration._from_cache(entry, host_figures=False) is not None
    assert calibration._from_cache(entry) is None
    assert calibration._from_cache(asdict(RATES)) == RATES


def test_a_plan_of_more_ranks_than_cores_asks_the_penalty_and_prices_it(monkeypatch, capsys):
    """4 ranks on 2 cores: the compute costs the 2 turns times the measured penalty (a plan
    once priced the turns alone, 37-50% under such runs); 2 ranks fill the cores and never
    start the probe."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(prediction, "rates_for", lambda device, threads: RATES)
    asked = []

    def compute(nproc: int, penalty: float) -> float:
        monkeypatch.setattr(
            prediction, "oversubscription_penalty", lambda: asked.append(nproc) or penalty
        )
        assert main(["--config", DDP, "--nproc", str(nproc), "--device", "cpu", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["predicted"]["compute_s"]

    assert compute(4, 1.5) == pytest.approx(1.5 * compute(4, 1.0))
    assert compute(2, 1.5) == pytest.approx(compute(2, 1.0))
    assert asked == [4, 4]
