"""Tests of ``shardwise.train.device``: training.device and the backend resolved against the
machine (a machine's GPU count is passed in, so the GPU rules are checked on CPU), the refusals
that name the key and the fix, and the device helpers' CPU behaviour. Nothing here runs on a GPU."""

import warnings

import pytest
import torch
from shardwise.train import device
from shardwise.train.config import load_config
from shardwise.train.parallelize import autocast_context

TWO_RANKS = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def resolved(overrides=(), cuda_devices=0, env=None):
    cfg = load_config(None, list(overrides), env=env or {}, cuda_devices=cuda_devices)
    return cfg.training.device, cfg.distributed.backend


def test_auto_is_the_gpu_when_there_is_one_with_nccl_for_cuda_tensors():
    """Catches: auto that ignores the machine, or a GPU default without NCCL."""
    assert resolved() == ("cpu", "shardwise")
    assert resolved(cuda_devices=1) == ("cuda", "cpu:shardwise,cuda:nccl")
    assert resolved(["training.device=cpu"], cuda_devices=1) == ("cpu", "shardwise")
    two = resolved(["distributed.backend=cpu:gloo,cuda:nccl"], cuda_devices=2, env=TWO_RANKS)
    assert two == ("cuda", "cpu:gloo,cuda:nccl")


@pytest.mark.parametrize(
    "overrides, cuda_devices, env, expected",
    [
        (["training.device=cuda"], 0, {}, ["training.device: cuda", "no CUDA GPU", "cpu"]),
        (["training.device=tpu"], 0, {}, ["training.device", "'tpu'"]),
        (["distributed.backend=nccl"], 0, {}, ["distributed.backend 'nccl'", "backend: shardwise"]),
        (
            ["distributed.backend=cpu:shardwise,cuda:nccl", "training.device=cpu"],
            1,
            {},
            ["uses NCCL", "training.device is cpu"],
        ),
        (
            ["distributed.backend=cpu:shardwise,cuda:nccl"],
            1,
            TWO_RANKS,
            ["two ranks on one GPU", "2 processes per node on 1 GPU", "=1", "backend: shardwise"],
        ),
        (["distributed.backend=tpu:nccl"], 1, {}, ["distributed.backend 'tpu:nccl'", "cpu:"]),
        (["distributed.backend=nccl,nccl"], 1, {}, ["distributed.backend 'nccl,nccl'"]),
    ],
)
def test_a_device_or_backend_the_machine_cannot_run_is_refused_with_the_fix(
    overrides, cuda_devices, env, expected
):
    """Catches: a config that validates and then fails inside init_process_group or .cuda()
    with a traceback (issue 16: `backend: nccl` passed validation on CPU machines)."""
    with pytest.raises(ValueError) as error:
        resolved(overrides, cuda_devices, env)
    for part in expected:
        assert part in str(error.value), (part, str(error.value))


def test_more_ranks_than_gpus_default_to_the_shardwise_backend_which_stages_through_the_host():
    """Catches: a default that sends two ranks on one GPU to NCCL (which refuses them), where
    the shardwise backend stages CUDA tensors through host memory instead."""
    assert resolved(cuda_devices=1, env=TWO_RANKS) == ("cuda", "shardwise")
    assert resolved(cuda_devices=2, env=TWO_RANKS) == ("cuda", "cpu:shardwise,cuda:nccl")


def test_this_machine_is_asked_when_no_gpu_count_is_given():
    """Catches: validation that assumes a GPU (or none) instead of asking torch."""
    cfg = load_config(None, [], env={})
    expected = "cuda" if torch.cuda.device_count() > 0 else "cpu"
    assert cfg.training.device == expected


def test_batches_stay_put_on_the_cpu_and_gpu_memory_is_not_reported_there():
    """Catches: a CPU run paying for pinned copies, or GPU fields in a CPU run's metrics."""
    batch = (torch.arange(6).view(2, 3), torch.arange(6).view(2, 3))
    moved = device.to_device(batch, torch.device("cpu"))
    assert all(a is b for a, b in zip(moved, batch, strict=True))
    assert device.gpu_memory_mb(torch.device("cpu")) == []
    assert device.local_device("cpu", 3) == torch.device("cpu")


def test_the_bf16_peak_is_the_data_sheets_by_device_name():
    """Catches: an H100 PCIe read as the SXM part (the longer name must win) and an unknown
    GPU given a made-up peak instead of a measured one."""
    assert device.bf16_peak("NVIDIA H100 80GB HBM3") == 989.4e12
    assert device.bf16_peak("NVIDIA H100 PCIe") == 756.5e12
    assert device.bf16_peak("NVIDIA H200") == 989.4e12
    assert device.bf16_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert device.bf16_peak("NVIDIA A10G") == 70e12
    assert device.bf16_peak("NVIDIA GeForce GTX 1080") is None


def test_autocast_follows_the_device():
    """Catches: autocast hard-coded to the CPU (a GPU run would then compute in fp32), and the
    precision word (training.mixed_precision) mapped to the wrong dtype."""
    with autocast_context("bf16", device="cpu"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast_context("fp16", device="cpu"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16
    with autocast_context("no", device="cpu"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with warnings.catch_warnings():  # without a GPU torch warns that it disables it
        warnings.simplefilter("ignore")
        context = autocast_context("bf16", device="cuda")
    assert isinstance(context, torch.autocast) and context.device == "cuda"
    assert isinstance(autocast_context("no", device="cuda"), type(autocast_context("no")))
