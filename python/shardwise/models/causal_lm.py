"""Any causal language model for ``shardwise-train``: a Hugging Face ``transformers`` model built
from its config (random init, nothing downloaded) or loaded from a local safetensors folder, or
whatever ``package.module:function`` (or ``path/file.py:function``) returns.

``CausalLM`` gives such a model the interface the trainer's transforms use, as the bundled GPT
has it: ``forward(tokens)`` returns the logits ``[batch, seq, vocab]`` (a Hugging Face output's
``.logits``, a tuple's first item, or the tensor), ``cross_entropy(logits, targets)`` the mean
token loss, ``blocks`` the transformer layers (the longest ``nn.ModuleList`` whose items share a
class: FSDP's units, ZeRO-3's, the checkpointed layers), ``layer_class`` their class name (seed
002's ``fsdp_transformer_layer_cls``). The model is held as ``inner``, so parameter names are
``inner.`` + the model's own; ``export_names`` drops the prefix, and a Hugging Face model's
export (its ``config.json`` beside ``model.safetensors``) loads with ``from_pretrained``.

``ModelShape`` is the bundled GPT's ``GPTConfig`` read off such a model (vocabulary, sequence,
width, layers, heads, parameter count from a meta-device copy): what the memory planner and the
MFU need.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .families import FAMILIES, published
from .gpt import GPTConfig

PREFIX = "inner."


@dataclass(frozen=True)
class ModelShape(GPTConfig):
    """A GPTConfig whose parameter count is measured, for a model that is not the bundled GPT."""

    parameters: int = 0
    layer_class: str = ""
    # what builds the model (a ``ModelBuilder``), so that the planner traces the model itself
    # (on fake tensors) rather than the bundled GPT of its sizes; None: not known
    builder: object = None

    def num_parameters(self) -> int:
        return self.parameters


def find_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The longest ``nn.ModuleList`` whose items are all one class (the transformer layers)."""
    best = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            if len({type(m) for m in module}) == 1 and (best is None or len(module) > len(best)):
                best = module
    return best


class CausalLM(nn.Module):
    """A causal LM behind the bundled GPT's interface (see the module docstring)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self._hf = _is_hf(inner)

    @property
    def blocks(self) -> nn.ModuleList:
        return find_blocks(self.inner) or nn.ModuleList()

    @property
    def layer_class(self) -> str:
        blocks = find_blocks(self.inner)
        return type(blocks[0]).__name__ if blocks is not None else ""

    @property
    def config(self):
        """A Hugging Face model's config (ZeRO sizes its buckets from its hidden_size)."""
        return getattr(self.inner, "config", None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.inner(input_ids=tokens, use_cache=False) if self._hf else self.inner(tokens)
        if hasattr(out, "logits"):
            return out.logits
        return out[0] if isinstance(out, tuple | list) else out

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.cross_entropy(self(tokens), targets)


def _is_hf(module: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(module, PreTrainedModel)


def export_names(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The wrapped model's own names (``inner.`` dropped)."""
    return {k.removeprefix(PREFIX): v for k, v in state.items()}


# --------------------------------------------------------------------------- Hugging Face


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError(
            "model.hf_config needs the transformers package (pip install transformers)"
        ) from None
    return transformers


def hf_config(spec: str, overrides: Mapping | None = None):
    """A transformers config: a model family (``gemma3_1b``, ``llama3_8b``, ...:
    ``families.py``), a model type it knows (``gpt2``, ``llama``, ...) with its defaults, or a
    ``config.json`` (or the folder holding one); ``overrides`` replace fields, each checked to be
    one of the config's (with "did you mean"), and the config is built with them (a field
    derived from others at construction, such as a head size, follows them)."""
    transformers = _transformers()
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if spec in FAMILIES:  # a released model's shape (models/families.py)
        spec, given = published(spec)
    elif path.suffix == ".json" or path.exists():
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"model.hf_config: cannot read {path}: {error}") from None
        if "model_type" not in values:
            raise ValueError(f"model.hf_config: {path} has no model_type; is it a config.json?")
        spec, given = values.pop("model_type"), values
    else:
        given = {}
    try:
        config = transformers.AutoConfig.for_model(spec, **given)
    except ValueError:
        known = sorted([*transformers.CONFIG_MAPPING.keys(), *FAMILIES])
        close = difflib.get_close_matches(spec, known, n=3)
        raise ValueError(
            f"model.hf_config: {spec!r} is neither a config.json nor a model type transformers "
            f"knows" + (f"; did you mean {', '.join(close)}?" if close else " (gpt2, llama, ...)")
        ) from None
    fields = config.to_dict().keys() | set(getattr(config, "attribute_map", {}))
    for key in overrides or {}:
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(
                f"model.hf_overrides.{key}: not a field of {type(config).__name__}{hint}"
            )
    if overrides:  # built again with them, so fields derived at construction follow
        config = transformers.AutoConfig.for_model(spec, **{**given, **overrides})
    return config


def build_hf(config, pretrained: str | None = None) -> nn.Module:
    """The causal LM of ``config``, randomly initialized from torch's RNG, or ``pretrained``'s
    safetensors weights (a local folder: nothing is downloaded, nothing unpickled)."""
    transformers = _transformers()
    if pretrained is None:
        return transformers.AutoModelForCausalLM.from_config(config)
    folder = Path(pretrained).expanduser()
    if not any(folder.glob("*.safetensors")):
        raise ValueError(
            f"model.pretrained: {folder} holds no .safetensors weights; give a local folder "
            "saved with save_pretrained (safetensors)"
        )
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, config=config, local_files_only=True, use_safetensors=True
    )


# --------------------------------------------------------------------------- factories


def load_factory(spec: str) -> Callable[..., nn.Module]:
    """``package.module:function`` or ``path/to/file.py:function``; ValueError naming
    model.factory when it cannot be imported or is not callable."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"model.factory: {spec!r}: write package.module:function or path/file.py:function"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            loader = importlib.util.spec_from_file_location(f"_factory_{path.stem}", path)
            if loader is None or not path.is_file():
                raise ImportError(f"{path} does not exist")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"model.factory: cannot import {module_name}: {error}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"model.factory: {module_name} has no callable {attr!r}")
    return fn


def build_factory(spec: str, args: Mapping | None = None) -> nn.Module:
    fn = load_factory(spec)
    try:
        model = fn(**dict(args or {}))
    except Exception as error:  # the user's code: say where it came from
        raise ValueError(
            f"model.factory: {spec}(**model.factory_args) raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model.factory: {spec} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


# --------------------------------------------------------------------------- shapes


def shape_of(builder: Callable[[], nn.Module], seq_len: int, vocab_size: int) -> ModelShape:
    """The ModelShape of what ``builder`` makes, built on the meta device (no memory)."""
    with torch.device("meta"):
        return shape_of_model(CausalLM(builder()), seq_len, vocab_size)


def shape_of_model(model: CausalLM, seq_len: int, vocab_size: int) -> ModelShape:
    """The ModelShape of ``model``: its parameters counted once each (tied ones once), its width
    from the first embedding."""
    config = model.config
    blocks = find_blocks(model.inner)
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    dim = getattr(config, "hidden_size", None) or (embeddings[0].embedding_dim if embeddings else 1)
    heads = getattr(config, "num_attention_heads", None) or 1
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    return ModelShape(
        vocab_size=getattr(config, "vocab_size", None) or vocab_size,
        seq_len=seq_len,
        dim=dim,
        layers=len(blocks) if blocks is not None else 1,
        heads=heads,
        mlp_ratio=max(1, round((inner or 4 * dim) / dim)),
        parameters=sum(p.numel() for p in model.parameters()),
        layer_class=model.layer_class,
    )


# --------------------------------------------------------------------------- the builder


@dataclass(frozen=True)
class ModelBuilder:
    """What ``model:`` names, as a callable that builds it (a ``CausalLM``) from torch's RNG:
    ``hf_config`` (+ ``hf_overrides``, ``pretrained``) or ``factory`` (+ ``factory_args``)."""

    hf_config: str | None = None
    hf_overrides: tuple = ()  # (key, value) pairs
    pretrained: str | None = None
    factory: str | None = None
    factory_args: tuple = ()

    def config(self):
        """The transformers config (None for a factory)."""
        if self.factory is not None:
            return None
        return hf_config(self.hf_config or self.pretrained, dict(self.hf_overrides))

    def __call__(self, weights: bool = True) -> CausalLM:
        """The model; ``weights=False``: a Hugging Face model's random init even when
        ``pretrained`` is set (what a meta-device shape needs)."""
        if self.factory is not None:
            return CausalLM(build_factory(self.factory, dict(self.factory_args)))
        return CausalLM(build_hf(self.config(), self.pretrained if weights else None))

    def shape(self, seq_len: int, vocab_size: int) -> ModelShape:
        shape = shape_of(lambda: self(weights=False).inner, seq_len, vocab_size)
        return replace(shape, builder=self)

    def max_positions(self) -> int | None:
        config = self.config()
        return getattr(config, "max_position_embeddings", None) if config is not None else None


class ModuleBuilder:
    """A model built by the caller (``shardwise.Trainer(model, ...)``) behind the builder's
    interface. Every rank starts from rank 0's weights, as DDP's constructor makes it: the
    parameters and buffers are broadcast when the run takes the model (the caller need not seed
    its ranks alike). The transforms then work on this very module (FSDP, ZeRO and tensor
    parallelism rewrite it in place, as torch's do)."""

    def __init__(self, module: nn.Module):
        self.module = module

    def config(self):
        """A Hugging Face model's config (its tp plan, pipeline split and export); None else."""
        return self.module.config if _is_hf(self.module) else None

    def __call__(self, weights: bool = True) -> CausalLM:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            with torch.no_grad():
                for tensor in [*self.module.parameters(), *self.module.buffers()]:
                    dist.broadcast(tensor.data, src=0)
        return CausalLM(self.module)

    def vocab_size(self, default: int) -> int:
        """The vocabulary: a Hugging Face config's, else the first embedding's rows."""
        config = self.config()
        if config is not None and getattr(config, "vocab_size", None):
            return config.vocab_size
        embeddings = [m for m in self.module.modules() if isinstance(m, nn.Embedding)]
        return embeddings[0].num_embeddings if embeddings else default

    def shape(self, seq_len: int, vocab_size: int) -> ModelShape:
        return shape_of_model(CausalLM(self.module), seq_len, self.vocab_size(vocab_size))

    def max_positions(self) -> int | None:
        config = self.config()
        return getattr(config, "max_position_embeddings", None) if config is not None else None
