"""``shardwise.DistributedConfig`` and ``shardwise.Trainer``'s checks, and the dataset streams
(``train/datasets.py``): everything a user's Python gets wrong is refused, naming the argument
or field and the fix, before any process group starts."""

from __future__ import annotations

import pytest
import shardwise
import torch
import torch.distributed as dist
from shardwise.train import datasets
from torch import nn

LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)


class Tiny(nn.Module):
    def __init__(self, vocab=32, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_the_guides_distributed_config_validates_and_derives():
    config = shardwise.DistributedConfig(
        enabled=True, world_size=8, num_nodes=2, num_processes_per_node=4, backend="gloo",
        tensor_parallel_size=2, pipeline_parallel_size=2,
    )  # fmt: skip
    assert config.get_data_parallel_size() == 2
    assert config.is_main_process() and config.is_local_main_process()
    assert config.strategy == "pipeline"  # a pp axis > 1, as in a config file
    mesh = shardwise.DistributedConfig(
        world_size=4, mesh_shape=(2, 2), mesh_axis_names=("dp", "tp")
    )
    assert (mesh.tensor_parallel_size, mesh.get_data_parallel_size()) == (2, 2)
    assert mesh.given() == {"world_size": 4, "mesh_shape": [2, 2], "mesh_axis_names": ["dp", "tp"]}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"world_size": 8, "num_nodes": 3, "num_processes_per_node": 4}, "num_nodes"),
        ({"world_size": 4, "rank": 4}, "rank < world_size"),
        ({"world_size": 2, "tensor_parallel_size": 4}, "tensor"),
        ({"world_size": 2, "wrld": 2}, "distributed.wrld"),
        ({"world_size": "two"}, "distributed.world_size"),
        ({"world_size": 2, "strategy": "ddp", "zero": {"zero_optimization": {"stage": 2}}},
         "distributed.zero"),
    ],
)  # fmt: skip
def test_a_distributed_config_that_breaks_a_rule_names_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        shardwise.DistributedConfig(**fields)


def test_the_trainer_takes_a_distributed_config_and_section_mappings(tmp_path):
    trainer = shardwise.Trainer(
        Tiny(), [torch.arange(9)] * 16,
        training_config={"micro_batch_size": 2, "checkpoint": {"dir": str(tmp_path)}},
        distributed_config=shardwise.DistributedConfig(strategy="fsdp", backend="gloo"),
    )  # fmt: skip
    cfg = trainer.config
    assert (cfg.distributed.strategy, cfg.distributed.backend) == ("fsdp", "gloo")
    assert (cfg.training.micro_batch_size, cfg.data.seq_len) == (2, 8)
    assert cfg.gpt_config().vocab_size == 32  # read off the model's embedding
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"model": "gpt2"}, TypeError, "model: str is not a torch.nn.Module"),
        ({"train_dataset": torch.zeros(4, 9, dtype=torch.long)}, TypeError, "train_dataset"),
        ({"train_dataset": [torch.rand(9)]}, TypeError, r"train_dataset\[0\] holds torch.float32"),
        ({"train_dataset": [{"text": "hi"}]}, TypeError, "without 'input_ids'"),
        ({"train_dataset": [torch.arange(9)], "eval_dataset": [torch.arange(5)]}, ValueError,
         "eval_dataset's items have 4 inputs"),
        ({"train_dataset": []}, ValueError, "train_dataset is empty"),
        ({"train_dataset": [torch.arange(9)], "config": {"data": {"seq_len": 4}}}, ValueError,
         "data.seq_len=4"),
        ({"train_dataset": None}, ValueError, "a model without train_dataset"),
        ({"train_dataset": [torch.arange(9)], "config": {"model": {"hf_config": "gpt2"}}},
         ValueError, "model.hf_config configures a model"),
        ({"train_dataset": [torch.arange(9)], "config": 3}, TypeError, "config: int"),
        ({"train_dataset": [torch.arange(9)], "distributed_config": [1]}, TypeError,
         "distributed_config: list is not a section"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_any_process_group(kwargs, error, named):
    kwargs = {"model": Tiny(), **kwargs}
    with pytest.raises(error, match=named):
        shardwise.Trainer(**kwargs)
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "item",
    [
        torch.arange(5),
        list(range(5)),
        {"input_ids": list(range(5))},
        {"input_ids": list(range(5)), "labels": [-100, 1, 2, 3, 4]},
        (torch.arange(4), torch.arange(1, 5)),
    ],
)
def test_each_item_form_reads_as_inputs_and_next_token_targets(item):
    inputs, targets = datasets.item_pair(item, "item")
    assert inputs.tolist() == [0, 1, 2, 3] and targets.tolist() == [1, 2, 3, 4]


def test_labels_are_shifted_as_a_hugging_face_causal_lm_shifts_them():
    _, targets = datasets.item_pair({"input_ids": [5, 6, 7], "labels": [-100, -100, 7]}, "x")
    assert targets.tolist() == [-100, 7]


class Items(torch.utils.data.IterableDataset):
    """An iterable dataset over ``rows``, in their order."""

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def _dataset(rows, iterable: bool):
    return Items(rows) if iterable else rows


def _global(streams, steps):
    """Per step, the rows of every rank's batch in rank order."""
    return [torch.cat([next(s)[0] for s in streams]) for _ in range(steps)]


@pytest.mark.parametrize("iterable", [False, True])
def test_two_data_ranks_read_the_one_rank_global_batches(iterable):
    rows = [torch.full((5,), i) for i in range(24)]

    def streams(world):
        dataset = _dataset(rows, iterable)
        return [datasets.stream(dataset, 4 // world, r, world, seed=3) for r in range(world)]

    one, two = _global(streams(1), 9), _global(streams(2), 9)
    for a, b in zip(one, two, strict=True):
        assert sorted(a[:, 0].tolist()) == sorted(b[:, 0].tolist())
    firsts = [int(x) for batch in one[:6] for x in batch[:, 0]]
    assert sorted(firsts) == list(range(24))  # one epoch reads every item once
    if iterable:
        assert firsts == list(range(24))  # in the dataset's own order


@pytest.mark.parametrize("iterable", [False, True])
def test_a_deterministic_epoch_ends_on_the_same_item_at_every_world(iterable):
    """contiguous + batches_per_step: 26 items hold 3 steps of 8 (2 dropped) at world 1
    (accumulation 4) and world 4 (accumulation 1), so step 4 (epoch 1) reads the same items.
    Catches an epoch (or a pass of an iterable dataset) that ends per global batch: at world 1
    it would keep all 26 items and start epoch 1 elsewhere."""
    rows = [torch.full((3,), i) for i in range(26)]

    def steps(world: int, whole_steps: bool) -> list[list[int]]:
        per_step = 4 // world
        streams = [datasets.stream(_dataset(rows, iterable), 2, r, world, seed=3,
                                   contiguous=True,
                                   batches_per_step=per_step if whole_steps else 1)
                   for r in range(world)]  # fmt: skip
        out = []
        for _ in range(4):  # micro-batch m = j * world + r of each step, in m order
            batches = [next(s)[0][:, 0].tolist() for _ in range(per_step) for s in streams]
            out.append(sum(batches, []))
        return out

    one = steps(1, True)
    assert one == steps(4, True)
    assert len(set(sum(one[:3], []))) == 24  # epoch 0: no item twice
    assert steps(1, False)[3] != steps(4, False)[3]  # the control: per-batch epochs differ


@pytest.mark.parametrize("iterable", [False, True])
def test_a_stream_resumes_at_its_saved_position(iterable):
    dataset = _dataset([torch.full((3,), i) for i in range(10)], iterable)
    first = datasets.stream(dataset, 2, 1, 2, seed=5)
    for _ in range(3):
        next(first)
    again = datasets.stream(dataset, 2, 1, 2, seed=5)
    again.load_state(first.state())
    for _ in range(4):
        assert torch.equal(next(first)[0], next(again)[0])


def test_items_of_different_lengths_in_one_batch_are_refused_with_the_fix():
    stream = datasets.stream([torch.arange(5), torch.arange(7)], 2, 0, 1, seed=0, shuffle=False)
    with pytest.raises(ValueError, match="pad every item to one length"):
        next(stream)
