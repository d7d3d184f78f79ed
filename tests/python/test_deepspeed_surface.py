"""DeepSpeed's module surface beyond ``initialize`` (``shardwise.deepspeed``), in one process:
``add_config_arguments`` as DeepSpeed's, the loader's restart-on-iter, the engine's attributes,
``save_checkpoint`` / ``load_checkpoint`` and their refusals, and ``shardwise-deepspeed``'s
command line. The world-2 run of a whole script against DeepSpeed's own is
tests/distributed/test_deepspeed_scripts.py."""

from __future__ import annotations

import argparse

import pytest
import shardwise.deepspeed
import torch
from shardwise import deepspeed_launcher

CONFIG = {
    "train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 2},
}


def test_add_config_arguments_adds_deepspeeds_arguments():
    """The same flags, defaults and group as DeepSpeed's (compared with DeepSpeed's parser when
    it is installed). Catches a script's --deepspeed_config refused as unknown."""
    parser = shardwise.deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed and args.deepspeed_config == "ds.json"
    assert not args.deepscale and args.deepscale_config is None
    deepspeed = pytest.importorskip("deepspeed")
    theirs = deepspeed.add_config_arguments(argparse.ArgumentParser())
    assert vars(theirs.parse_args([])) == vars(parser.parse_args([]))


def _engine_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
    return shardwise.deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=data, config=CONFIG
    )


def _train(engine, loader, steps):
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if len(losses) == steps:
            return losses
    return losses


def test_the_loader_restarts_on_iter_and_shuffles_as_deepspeeds():
    """iter(loader) starts the epoch over and returns the loader (DeepSpeed's), batches of
    train_micro_batch_size_per_gpu, order from DistributedSampler(seed 0) even in one process."""
    _, _, loader, _ = _engine_and_data()
    assert iter(loader) is loader and len(loader) == 6
    first = next(iter(loader))[0]
    again = [x for x, _ in loader]
    assert torch.equal(first, again[0]) and len(again) == 6
    order = list(torch.utils.data.DistributedSampler(range(12), num_replicas=1, rank=0))
    assert torch.equal(torch.cat(again), loader.dataloader.dataset.tensors[0][order])


def test_engine_attributes_are_deepspeeds(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    engine, _, loader, _ = _engine_and_data()
    assert (engine.local_rank, engine.global_rank, engine.world_size) == (3, 0, 1)
    assert engine.train_batch_size() == 4 and engine.train_micro_batch_size_per_gpu() == 2
    assert engine.gradient_accumulation_steps() == 2 and engine.zero_optimization_stage() == 2
    assert not engine.fp16_enabled() and not engine.bf16_enabled()
    assert engine.get_global_grad_norm() is None
    it = iter(loader)
    _train(engine, it, 1)
    assert not engine.was_step_applied()  # between accumulation boundaries
    _train(engine, it, 1)
    assert engine.was_step_applied() and engine.global_steps == 1
    assert engine.get_global_grad_norm() is None  # computed only by clipping
    clipped, _, loader, _ = shardwise.deepspeed.initialize(
        model=torch.nn.Linear(4, 1), config={**CONFIG, "gradient_clipping": 1e-3}
    )
    x = torch.randn(2, 4)
    for _ in range(2):
        clipped.backward(clipped(x).pow(2).mean())
        clipped.step()
    assert clipped.get_global_grad_norm() > 1e-3


def test_a_checkpoint_resumes_exactly_and_refuses_what_it_cannot_keep(tmp_path):
    """save_checkpoint writes <tag>/ and latest; load_checkpoint of a fresh engine returns the
    client state and the next steps equal the uninterrupted run's. Saving the same tag again
    replaces it. Without latest: (None, None). Refused before anything is written: client
    state the safe loader cannot read back, a tag that is a path; refused on load: the model
    without the optimizer (its master weights would be stale)."""
    engine, _, loader, _ = _engine_and_data()
    it = iter(loader)
    _train(engine, it, 2)
    assert engine.load_checkpoint(tmp_path) == (None, None)
    engine.save_checkpoint(tmp_path, client_state={"seen": 2, "note": "x"})
    engine.save_checkpoint(tmp_path, client_state={"seen": 2, "note": "y"})  # same tag again
    assert (tmp_path / "latest").read_text() == "global_step1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step1", "latest"]
    rest = _train(engine, it, 4)
    fresh, _, fresh_loader, _ = _engine_and_data()
    path, client = fresh.load_checkpoint(tmp_path)
    assert path.endswith("global_step1/mp_rank_00_model_states.pt")
    assert client == {"seen": 2, "note": "y", "global_steps": 1}
    it = iter(fresh_loader)
    for _ in range(client["seen"]):
        next(it)
    assert _train(fresh, it, 4) == rest
    with pytest.raises(ValueError, match="client_state must hold only"):
        engine.save_checkpoint(tmp_path, tag="bad", client_state={"f": lambda: 0})
    with pytest.raises(ValueError, match="plain folder name"):
        engine.save_checkpoint(tmp_path, tag="a/b")
    assert not (tmp_path / "bad").exists() and not (tmp_path / ".bad.tmp").exists()
    with pytest.raises(ValueError, match="without the optimizer state"):
        fresh.load_checkpoint(tmp_path, load_module_only=True)


def test_the_launcher_maps_deepspeeds_line_to_torchrun(tmp_path):
    """shardwise-deepspeed --num_gpus 2 script.py ARGS runs torchrun with 2 processes per node
    and the script's own arguments after it; a multi-node line maps each key; DeepSpeed's host
    files are refused naming the torchrun line."""
    script = tmp_path / "train.py"
    args = deepspeed_launcher.parse_args(
        ["--num_gpus", "2", str(script), "--deepspeed", "--deepspeed_config", "ds.json"]
    )
    command = deepspeed_launcher.torchrun_command(args)
    assert "--nproc_per_node=2" in command and "--standalone" in command
    assert command[-4:] == [str(script), "--deepspeed", "--deepspeed_config", "ds.json"]
    args = deepspeed_launcher.parse_args(
        ["--num_nodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", str(script)]
    )
    command = deepspeed_launcher.torchrun_command(args)
    assert "--nproc_per_node=auto" in command
    for flag in ("--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29500"):
        assert flag in command
    one_host = deepspeed_launcher.parse_args(["--master_port", "29611", str(script)])
    command = deepspeed_launcher.torchrun_command(one_host)
    assert "--master_port=29611" in command and "--standalone" not in command
    with pytest.raises(SystemExit):
        deepspeed_launcher.parse_args(["--hostfile", "hosts", str(script)])
    with pytest.raises(SystemExit):
        deepspeed_launcher.parse_args(["--num_gpus", "0", str(script)])
