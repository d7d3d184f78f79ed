"""The ``model:`` section for models other than the bundled GPT (``train/model_source.py``,
``models/causal_lm.py``): what is refused at validation, with the key and the fix; the shape
the planner reads; pretrained weights loaded as saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shardwise.models.causal_lm import CausalLM, ModelBuilder, find_blocks
from shardwise.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY_GPT2 = (
    "model.hf_overrides={n_layer: 2, n_embd: 64, n_head: 4, n_positions: 64, vocab_size: 256}"
)
PIPE = ("distributed.strategy=pipeline", "distributed.world_size=2")
TP2 = ("distributed.world_size=2", "distributed.strategy=ddp", "distributed.tensor_parallel_size=2")
TP8 = "distributed.tensor_parallel_size=8"
FACTORY = f"model.factory={ROOT / 'tests' / 'data' / 'models' / 'tiny_lm.py'}:tiny_lm"


def config(*overrides):
    return load_config(None, list(overrides), env={}, cuda_devices=0)


def test_a_hugging_face_shape_is_measured():
    """The planner's shape: sizes from the transformers config, parameters counted on a meta
    copy (GPT-2's tied head once), the layer class for FSDP's wrap."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = config("model.hf_config=gpt2", TINY_GPT2, "data.seq_len=32")
    shape = cfg.gpt_config()
    ref = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt2", n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256)
    )
    assert shape.num_parameters() == sum(p.numel() for p in ref.parameters())
    assert (shape.vocab_size, shape.seq_len, shape.dim, shape.layers, shape.heads) == (
        256, 32, 64, 2, 4,
    )  # fmt: skip
    assert shape.layer_class == "GPT2Block"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model.hf_config=gtp2",), "did you mean gpt2"),
        (("model.hf_config=gpt2", "model.hf_overrides={n_layr: 2}"), "did you mean n_layer"),
        (("model.hf_config=gpt2", "model.dim=128"), "model.dim sizes the bundled GPT"),
        (("model.hf_config=gpt2", TINY_GPT2, "data.seq_len=128"), "max_position_embeddings=64"),
        (("model.hf_overrides={n_layer: 2}",), "model.hf_overrides needs model.hf_config"),
        ((FACTORY, "model.hf_config=gpt2"), "name two models; give one"),
        ((FACTORY,), "model.seq_len: give the sequence length"),
        (("model.factory=no_such_module:fn", "model.seq_len=8"), "cannot import no_such_module"),
        (("model.factory=json:nothing", "model.seq_len=8"), "has no callable 'nothing'"),
        (("model.factory=json", "model.seq_len=8"), "write package.module:function"),
        (
            ("model.factory=json:dumps", "model.seq_len=8"),
            r"json:dumps\(\*\*model.factory_args\) raised TypeError",
        ),
        (("model.pretrained=/nonexistent/folder",), "model.pretrained: .* is not a folder"),
        ((FACTORY, "model.seq_len=8", *PIPE), "the pipeline strategy with model.factory"),
        ((FACTORY, "model.seq_len=8", *TP2), "tensor parallelism with model.factory"),
        (("model.hf_config=qwen2", *PIPE), "no split for model_type 'qwen2'"),
        (("model.hf_config=gpt_neo", *TP2), "no tensor-parallel plan for model_type 'gpt_neo'"),
        (
            ("model.hf_config=gpt2", TINY_GPT2, *TP2, "distributed.world_size=8", TP8),
            r"n_head = 4 is not divisible by the tensor-parallel size 8.*hf_overrides.n_head",
        ),
        (
            ("model.hf_config=llama", "model.hf_overrides={pad_token_id: 0}", *TP2),
            "set model.hf_overrides.pad_token_id to null",
        ),
        (
            ("model.hf_config=gpt2", TINY_GPT2, *TP2, "distributed.sequence_parallel=true"),
            "sequence_parallel with a Hugging Face model is not supported",
        ),
    ],
)
def test_bad_model_sections_are_refused_with_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(*overrides)


def test_a_factory_returning_something_else_is_named(tmp_path):
    (tmp_path / "f.py").write_text("def make():\n    return 42\n")
    with pytest.raises(ValueError, match="returned int, not a torch.nn.Module"):
        ModelBuilder(factory=f"{tmp_path / 'f.py'}:make")()


def test_pretrained_weights_load_as_saved(tmp_path):
    """model.pretrained: save_pretrained's safetensors folder loads into the trainer's model
    (the inner. prefix and nothing else added); a folder without safetensors is refused."""
    cfg = config("model.hf_config=gpt2", TINY_GPT2)
    torch.manual_seed(3)
    saved = cfg.model._builder().inner
    saved.save_pretrained(tmp_path / "ckpt")
    loaded = config(f"model.pretrained={tmp_path / 'ckpt'}").model._builder()
    assert isinstance(loaded, CausalLM)
    ours = {k.removeprefix("inner."): v for k, v in loaded.state_dict().items()}
    for name, tensor in saved.state_dict().items():
        assert torch.equal(ours[name], tensor), name
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((tmp_path / "ckpt" / "config.json").read_text())
    with pytest.raises(ValueError, match="holds no .safetensors"):
        ModelBuilder(pretrained=str(tmp_path / "empty"))()


def test_blocks_are_the_longest_list_of_one_class():
    from torch import nn

    model = nn.Module()
    model.small = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])  # two classes: not layers
    model.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    assert find_blocks(model) is model.layers
