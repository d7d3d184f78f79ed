"""The start-of-run device check (``shardwise.train.device_check``): ranks on different kinds of
device are refused, naming each field that differs and which ranks hold which value, unless
``training.allow_mixed_devices`` turns the refusal into a warning; alike devices pass, and the
start line names each rank's CUDA device and CUDA_VISIBLE_DEVICES. Descriptions are made here,
as ``describe`` gives them, so a mixed cluster can be tested on one machine."""

from __future__ import annotations

import pytest
import torch
from shardwise.train import device_check


def _gpu(name="NVIDIA H100 80GB HBM3", capability="9.0", memory=79.2, index=0, visible="0,1"):
    return {"kind": "cuda", "name": name, "capability": capability, "memory_gib": memory,
            "cores": None, "index": index, "visible": visible}  # fmt: skip


def test_alike_devices_pass_whatever_each_rank_sees():
    """Catches the per-rank fields (the device index, CUDA_VISIBLE_DEVICES) compared: ranks of
    one node see different GPUs by design."""
    ranks = [_gpu(index=0, visible="0,1"), _gpu(index=1, visible="0,1"), _gpu(visible="3")]
    assert device_check.check(ranks, allow_mixed=False) is None
    line = device_check.start_line(ranks)
    assert "3 x NVIDIA H100 80GB HBM3 (sm 9.0)" in line
    assert "1: cuda:1 of CUDA_VISIBLE_DEVICES=0,1" in line and "CUDA_VISIBLE_DEVICES=3" in line


def test_a_mixed_cluster_is_refused_naming_the_ranks_and_what_differs():
    """Catches a mismatch let through, or an error that does not say which ranks differ in
    what (name, capability, memory), or that hides the fix."""
    a100 = _gpu(name="NVIDIA A100-SXM4-40GB", capability="8.0", memory=39.4)
    ranks = [_gpu(), _gpu(), a100, _gpu()]
    with pytest.raises(device_check.DeviceMismatchError) as error:
        device_check.check(ranks, allow_mixed=False)
    text = str(error.value)
    assert "name differs (ranks 0, 1, 3: 'NVIDIA H100 80GB HBM3'; rank 2: 'NVIDIA A100" in text
    assert "capability differs" in text and "memory_gib differs" in text
    assert "training.allow_mixed_devices: true" in text


def test_allow_mixed_devices_turns_the_refusal_into_a_warning():
    """Catches training.allow_mixed_devices parsed and ignored: the same cluster goes on, with
    the differences in the warning."""
    ranks = [_gpu(), _gpu(memory=94.0)]
    warning = device_check.check(ranks, allow_mixed=True)
    assert warning.startswith("warning: ") and "memory_gib differs" in warning
    assert "rank 1: 94.0" in warning


def test_cpu_processes_compare_the_model_and_cores():
    """Catches CPU ranks on machines of another processor or core count passing unseen."""
    here = device_check.describe(torch.device("cpu"))
    assert here["kind"] == "cpu" and here["cores"] and here["name"]
    other = {**here, "cores": here["cores"] * 2}
    assert device_check.check([here, here], allow_mixed=False) is None
    with pytest.raises(device_check.DeviceMismatchError, match="cores differs"):
        device_check.check([here, other], allow_mixed=False)
    assert device_check.start_line([here]).startswith("devices: 1 CPU process on ")
