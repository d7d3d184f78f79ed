"""Two ranks on one GPU (the common single-GPU test machine): NCCL refuses them, so the shardwise
backend stages their CUDA tensors through host memory (SHARDWISE_CUDA_COMM=auto finds that they
share the device). FSDP and ZeRO-3 at worlds 2 and 4 against one-process training of the global
batch on the same GPU, and shardwise-train under torchrun with 2 and 4 processes. Catches the
staged path's copies (a result not copied back, a copy before the producing kernel finished) and
the default backend choosing NCCL for ranks that share a GPU."""

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, kind, world, errors):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import fsdp_checks
        import shardwise
        import shardwise.zero
        import torch.distributed as dist
        import zero_checks
        from fsdp_checks import assert_close_rel, global_batch, local, loss_of, make_model

        cuda = torch.device("cuda", 0)
        torch.cuda.set_device(cuda)
        dist.init_process_group("shardwise", rank=rank, world_size=world)
        ref = make_model().to(cuda)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
        if kind == "fsdp":
            model = shardwise.FullyShardedDataParallel(
                make_model().to(cuda), wrap=[f"layers.{i}" for i in range(3)]
            )
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        else:
            model = shardwise.zero.initialize(
                make_model().to(cuda), zero_checks.zero_config(3, world)
            )
        for step in range(6):
            batch = [t.to(cuda) for t in global_batch(step, world)]
            ref_loss = loss_of(ref, *batch)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            loss = loss_of(model, *local(batch, rank))
            if kind == "fsdp":
                loss.backward()
                opt.step()
                opt.zero_grad()
            else:
                model.backward(loss)
                model.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            assert_close_rel([total.item() / world], [ref_loss.item()], 1e-5, f"losses {step}")
        if kind == "fsdp":
            fsdp_checks.compare_params(model, ref, 1e-5, "parameters")
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001  (reported to the parent)
        errors[rank] = f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["fsdp", "zero3"])
def test_ranks_on_one_gpu_match_one_process(kind, world):
    errors = mp.Manager().dict()
    mp.spawn(_rank, args=(_free_port(), kind, world, errors), nprocs=world, join=True)
    assert not errors, dict(errors)


def _gather_rank(rank, port, world, errors):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import shardwise  # noqa: F401  (registers the backend)
        import torch.distributed as dist

        torch.cuda.set_device(0)
        dist.init_process_group("shardwise", rank=rank, world_size=world)
        mine = torch.arange(6.0, device="cuda").view(3, 2).t() + 10 * rank  # not contiguous
        parts = [torch.empty(2, 3, device="cuda") for _ in range(world)]
        dist.all_gather(parts, mine)
        for r, part in enumerate(parts):
            assert part.is_cuda, part.device
            expected = torch.arange(6.0).view(3, 2).t() + 10 * r
            assert torch.equal(part.cpu(), expected), (r, part)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001  (reported to the parent)
        errors[rank] = f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("world", [2, 4])
def test_all_gather_into_a_list_of_cuda_tensors(world):
    """all_gather with a list of CUDA outputs (DDP's constructor checks parameter shapes with it,
    tensor parallelism gathers full weights with it): catches the backend refusing CUDA tensors
    there, or cutting the gathered buffer into the wrong pieces."""
    errors = mp.Manager().dict()
    mp.spawn(_gather_rank, args=(_free_port(), world, errors), nprocs=world, join=True)
    assert not errors, dict(errors)


@pytest.mark.parametrize(
    "nproc, config, precision",
    [
        (2, "ddp.yaml", None),
        (2, "pipeline_1f1b.yaml", None),
        (4, "dp_x_pp.yaml", None),
        (4, "fsdp_x_tp.yaml", None),
        (8, "dp_pp_tp.yaml", None),
        (2, "ddp.yaml", "fp16"),
        (2, "zero2.yaml", "fp16"),
        (2, "fsdp.yaml", "bf16"),
    ],
)
def test_every_strategy_trains_with_ranks_sharing_the_gpu(tmp_path, nproc, config, precision):
    """DDP, the 1F1B pipeline, dp x pp, FSDP x TP and dp x pp x tp under shardwise-train (the
    mesh-wide clip and the checkpoint writer rule of the C++ training library), all ranks on one
    GPU, and fp16 (the C++ GradScaler; ZeRO's own scaler) and bf16 under CUDA autocast: catches
    a strategy whose collectives or point-to-point sends take NCCL for ranks that share a
    device, a tensor left on the CPU, or a precision that does not reach the GPU's autocast."""
    from train_runs import losses, train  # tests/distributed, put on the path by conftest.py

    extra = (f"training.mixed_precision={precision}",) if precision else ()
    recs, _ = train(
        nproc, config, tmp_path / "run", "training.device=cuda", "training.max_steps=8",
        "training.gradient_accumulation_steps=1", *extra, timeout=300,
    )  # fmt: skip
    assert sorted(losses(recs)) == list(range(1, 9)), recs[-1]
    assert all(math.isfinite(r["loss"]) for r in recs), recs
    peaks = recs[-1]["gpu_peak_mb_per_rank"]
    assert len(peaks) == nproc and min(peaks) > 0, recs[-1]


def test_shardwise_train_runs_two_ranks_on_one_gpu():
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "shardwise.train", "--config", str(ROOT / "examples" / "configs" / "fsdp.yaml"),
            "model.preset=tiny", "training.device=cuda", "training.max_steps=4",
            "training.warmup_steps=1",
            "training.log_every=1", f"training.checkpoint.dir={out}",
        ]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert records[-1]["step"] == 4 and len(records[-1]["gpu_peak_mb_per_rank"]) == 2
