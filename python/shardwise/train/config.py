"""The configuration of ``shardwise-train``: one YAML file plus dotted command-line overrides,
validated completely before any work starts.

Design:

* ``load_config(path, overrides)`` reads the YAML with OmegaConf, merges the overrides
  (``OmegaConf.from_dotlist``, so ``model.mesh_shape=[[2,1],["fsdp","tp"]]`` parses as a list)
  and hands the plain dict to ``validate``, a pure function (no ``torch.distributed`` call; the
  environment is an argument, ``os.environ`` by default).
* The shape of the file is four pydantic v2 models (``model``, ``data``, ``training``,
  ``distributed``) with extra keys forbidden. Their errors are rewritten as ``ValueError``s that
  name the dotted key, the bad value and the fix; an unknown key gets the closest known key as a
  "did you mean" suggestion.
* The sub-blocks that already have a validator are handed to it rather than re-modelled:
  ``distributed.fsdp`` (and the FSDP keys written flat under ``distributed:``, which are
  lifted into it) goes to ``shardwise.FSDPConfig``, ``distributed.zero`` to ``shardwise.zero``'s
  DeepSpeed-style loader, the pipeline schedule to the C++ schedule builder.
* The cross-field rules (the distributed config's rules, the mesh, the strategy, the
  batch split) run after the models are built. Values left out are resolved in place:
  ``world_size``/``rank``/``local_rank`` from torchrun's variables, the strategy from the mesh
  axes and sub-blocks, the mixed precision from ``bf16``/``mixed_precision``. The dump
  (``to_dict``/``to_yaml``) is therefore the config that actually ran, minus the per-process
  ``rank``/``local_rank``, and loads again.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from .. import _C
from ..fsdp.config import FSDPConfig
from ..models.gpt import PRESETS, GPTConfig
from ..zero.config import TOP_KEYS as ZERO_TOP_KEYS
from ..zero.config import load as load_zero
from ..zero.deepspeed_keys import auto_from_hidden_size
from . import device as device_mod
from . import model_source, sources
from .device import BACKENDS  # noqa: F401  (re-exported: the backends a config may name)

STRATEGIES = ("ddp", "fsdp", "zero", "pipeline")
PRECISIONS = ("no", "fp16", "bf16")
FSDP_KEYS = tuple(f.name for f in fields(FSDPConfig) if f.name != "extra")
# FSDP keys that may sit flat under ``distributed:`` (they are moved into ``fsdp:``).
FLAT_FSDP_KEYS = tuple(k for k in FSDP_KEYS if k.startswith("fsdp_") or k == "use_fsdp")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Section):
    """A bundled GPT preset; any GPTConfig field given here overrides the preset's."""

    preset: str = "tiny"
    vocab_size: int | None = Field(None, gt=0)
    seq_len: int | None = Field(None, gt=0)
    dim: int | None = Field(None, gt=0)
    layers: int | None = Field(None, gt=0)
    heads: int | None = Field(None, gt=0)
    mlp_ratio: int | None = Field(None, gt=0)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    mesh_shape: list | None = None  # [[num_fsdp, num_tp], ["fsdp", "tp"]]
    # instead of the GPT (model_source.py): a transformers causal LM (a model type such as gpt2
    # or llama, or a config.json), sized by hf_overrides; local safetensors weights; or a factory
    hf_config: str | None = None
    hf_overrides: dict[str, Any] | None = None
    pretrained: str | None = None
    factory: str | None = None  # package.module:function or path/file.py:function
    factory_args: dict[str, Any] | None = None
    _builder: Any = PrivateAttr(None)
    _shape: Any = PrivateAttr(None)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset; valid presets: {', '.join(PRESETS)}")
        return value

    def gpt(self) -> GPTConfig:
        """The preset with the explicitly given fields replaced (another model: its shape)."""
        if self._shape is not None:
            return self._shape
        given = {f.name: getattr(self, f.name) for f in fields(GPTConfig)}
        return replace(PRESETS[self.preset], **{k: v for k, v in given.items() if v is not None})


class DataSection(_Section):
    """The bundled corpus, or your own data (``sources.py`` reads it)."""

    corpus: Literal["pydoc"] = "pydoc"  # used when no path is given
    path: str | None = None  # a text file or folder, .bin, .npy, or a local dataset file
    format: Literal["auto", "text", "bin", "npy", "json", "csv", "parquet", "arrow"] = "auto"
    dtype: Literal["uint8", "uint16", "uint32", "int32", "int64"] = "uint16"  # of .bin files
    tokenizer: str = "byte"  # or a tokenizer.json (the file or its folder)
    text_field: str = "text"  # the dataset column to tokenize
    val_path: str | None = None  # default: val.bin beside train.bin, else the split below
    val_fraction: float = Field(0.05, gt=0.0, lt=1.0)
    seq_len: int | None = Field(None, gt=0)  # default: the model's seq_len
    shuffle_seed: int | None = None  # the order of the batches; default: training.seed


class CheckpointSection(_Section):
    dir: str = "outputs/run"
    every_steps: int = Field(50, gt=0)
    keep_last: int = Field(3, gt=0)


def _precision_word(value):
    """YAML 1.1 reads a bare ``no`` as false: take it back as the word."""
    return "no" if value is False else value


class ProfileSection(_Section):
    """torch.profiler's schedule: skip ``wait`` steps, warm up ``warmup``, record ``active``."""

    wait: int = Field(1, ge=0)
    warmup: int = Field(1, ge=0)
    active: int = Field(3, gt=0)
    record_shapes: bool = False


class TrainingSection(_Section):
    micro_batch_size: int = Field(
        4, gt=0, validation_alias=AliasChoices("micro_batch_size", "batch_size")
    )
    gradient_accumulation_steps: int = Field(1, gt=0)
    # reduce the gradients every this many micro-batches of an accumulation (ddp and
    # fsdp; default: only after the last); must divide gradient_accumulation_steps
    sync_gradients_every: int | None = Field(None, gt=0)
    learning_rate: float = Field(3e-4, gt=0)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    base_batch_size: int | None = Field(None, gt=0)
    warmup_steps: int = Field(10, ge=0)
    gradient_clip_norm: float | None = Field(1.0, ge=0)
    bf16: bool | None = None  # the FSDP config's spelling of mixed_precision: bf16 / no
    mixed_precision: Literal["no", "fp16", "bf16"] | None = None
    # fp16 outside ZeRO: dynamic loss scaling from 2 ** this (ZeRO takes DeepSpeed's fp16 block)
    initial_loss_scale_power: int = Field(16, ge=0, le=64)
    gradient_checkpointing: bool = False
    max_steps: int = Field(100, gt=0)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when a GPU is present
    log_every: int = Field(1, gt=0)
    # eval loss on the validation tokens every this many steps (0: never; default: with every
    # checkpoint) and at the end, over eval_batches global batches (the same ones each time)
    eval_every: int | None = Field(None, ge=0)
    eval_batches: int = Field(4, gt=0)
    # every logged step, the shardwise backend's operations of the step (calls, bytes,
    # seconds per kind, on rank 0) in the metrics, TensorBoard and the console
    profile_communication: bool = False
    # a Chrome trace per rank of the steps the schedule records, in <checkpoint.dir>/profile
    profile: ProfileSection | None = None
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)

    _precision = field_validator("mixed_precision", mode="before")(_precision_word)


class PipelineSection(_Section):
    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"] = "1f1b"
    num_microbatches: int | None = Field(None, gt=0)  # default: the number of stages
    virtual_stages: int = Field(1, gt=0)
    split: Literal["parameters", "time"] = "parameters"


class DistributedSection(_Section):
    """The distributed config's fields plus the strategy and its sub-blocks."""

    enabled: bool | None = None
    strategy: Literal["ddp", "fsdp", "zero", "pipeline"] | None = None
    # a name, or a device:name list; default: shardwise on CPU, cpu:shardwise,cuda:nccl on GPUs
    backend: str | None = None
    world_size: int | None = Field(None, gt=0)
    rank: int | None = Field(None, ge=0)
    local_rank: int | None = Field(None, ge=0)
    num_nodes: int | None = Field(None, gt=0)  # default: world_size / processes per node
    num_processes_per_node: int | None = Field(None, gt=0)
    master_addr: str | None = None
    master_port: int | None = Field(None, gt=0, lt=65536)
    # seconds a collective may wait for a peer before every rank raises "Timed out" naming it
    # (a link cut sends no FIN, so only this notices it); None: torch's default (30 minutes)
    timeout_s: float | None = Field(None, gt=0)
    tensor_parallel_size: int | None = Field(None, gt=0)
    sequence_parallel: bool = False  # with tp > 1: norms and residuals split along the sequence
    # with sequence_parallel: column-parallel layers keep their gathered input for backward
    # (one all-gather less per layer, tp times that input's memory)
    sequence_parallel_save_gathered: bool = False
    pipeline_parallel_size: int | None = Field(None, gt=0)
    mesh_shape: list | None = None
    mesh_axis_names: list[str] | None = None
    mixed_precision: Literal["no", "fp16", "bf16"] | None = None
    fsdp: dict[str, Any] | None = None
    zero: dict[str, Any] | None = None  # DeepSpeed's keys, or the path of a ds_config.json
    pipeline: PipelineSection | None = None
    # the launch keys the config itself gave (before the defaults were filled in)
    _launch_given: set = PrivateAttr(default_factory=set)

    _precision = field_validator("mixed_precision", mode="before")(_precision_word)

    @field_validator("zero", mode="before")
    @classmethod
    def _zero_file(cls, value):
        """A DeepSpeed JSON file, read (and checked as a mapping) here."""
        if not isinstance(value, str):
            return value
        path = Path(value).expanduser()
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise ValueError(f"cannot read the DeepSpeed config {path}: {error.strerror}") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds {type(data).__name__}, not a DeepSpeed config mapping")
        return data

    def get_data_parallel_size(self) -> int:
        return self.world_size // (self.tensor_parallel_size * self.pipeline_parallel_size)

    def is_main_process(self) -> bool:
        return self.rank == 0

    def is_local_main_process(self) -> bool:
        return self.local_rank == 0


class TrainConfig(_Section):
    """The whole run. Build it with ``load_config`` or ``validate`` (which resolve the defaults
    and check the cross-field rules), not with the constructor alone."""

    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    _layout: Any = PrivateAttr(None)  # the ParallelLayout, set by validate

    @property
    def data_parallel_size(self) -> int:
        return self.distributed.get_data_parallel_size()

    @property
    def effective_batch_size(self) -> int:
        """micro batch × gradient accumulation × data-parallel world; with a pipeline
        also × its microbatches per step (``training.micro_batch_size`` is one microbatch)."""
        t = self.training
        per_step = t.micro_batch_size * t.gradient_accumulation_steps * self.data_parallel_size
        if self.distributed.strategy == "pipeline":
            per_step *= self.distributed.pipeline.num_microbatches
        return per_step

    @property
    def scaled_learning_rate(self) -> float:
        t = self.training
        return scale_learning_rate(
            t.learning_rate, self.effective_batch_size, t.base_batch_size, t.lr_scaling
        )

    @property
    def mixed_precision(self) -> str:
        return self.training.mixed_precision or "no"

    def gpt_config(self) -> GPTConfig:
        return self.model.gpt()

    def mesh(self) -> list | None:
        """The mesh as ``[[sizes...], [axis names...]]`` (from model or distributed), or None."""
        layout = self.layout()
        return [list(layout.mesh_sizes), list(layout.mesh_names)] if layout.mesh_key else None

    def layout(self) -> _C.ParallelLayout:
        """The parallel layout, resolved once by ``validate`` (the C++ ``ParallelLayout``); a
        config not validated yet gets its mesh's own (the mesh's product as the world)."""
        if self._layout is not None:
            return self._layout
        meshes = _given_meshes(self)
        return _C.ParallelLayout(math.prod(meshes[0][1]) if meshes else 1, meshes)

    def fsdp_config(self) -> FSDPConfig:
        return FSDPConfig.from_mapping({**(self.distributed.fsdp or {}), "use_fsdp": True})

    def zero_config(self) -> dict:
        """The validated DeepSpeed-style config (``shardwise.zero.load_config``'s result)."""
        return load_zero(_zero_mapping(self), self.data_parallel_size, self.zero_auto())

    def zero_auto(self) -> dict:
        """What DeepSpeed's "auto" values become, from the training section (as Hugging Face's
        Trainer fills them from its arguments)."""
        t = self.training
        micro, accumulation = t.micro_batch_size, t.gradient_accumulation_steps
        return {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accumulation,
            "train_batch_size": micro * accumulation * self.data_parallel_size,
            "gradient_clipping": t.gradient_clip_norm or 0.0,
            "fp16": self.mixed_precision == "fp16",
            "bf16": self.mixed_precision == "bf16",
            "lr": self.scaled_learning_rate,
            "betas": [0.9, 0.95],
            "eps": 1e-8,
            "weight_decay": 0.1,
            "warmup_min_lr": 0.0,
            "warmup_num_steps": t.warmup_steps,
            "total_num_steps": t.max_steps,
            **auto_from_hidden_size(self.gpt_config().dim),
        }

    def to_dict(self) -> dict:
        """The resolved config as plain data; rank and local_rank, which differ per process and
        come from the launcher, are left out so that the dump loads again on every rank."""
        out = self.model_dump(mode="json")
        out["distributed"]["rank"] = out["distributed"]["local_rank"] = None
        return out

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.create(self.to_dict()))


def scale_learning_rate(lr: float, effective: int, base: int | None, rule: str) -> float:
    """none: ``lr``; linear: ``lr × effective/base``; sqrt: ``lr × sqrt(effective/base)``."""
    if rule == "none":
        return lr
    ratio = effective / base
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


def load_config(
    path: str | None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cuda_devices: int | None = None,
) -> TrainConfig:
    """The validated config from a YAML file (or none) and dotted overrides such as
    ``training.micro_batch_size=8`` or ``model.mesh_shape=[[2,1],["fsdp","tp"]]``. A bare
    ``model=NAME`` selects a preset. Raises ValueError naming the key, the value and the fix.
    ``env`` and ``cuda_devices`` describe the machine (default: this one; see ``validate``)."""
    overrides = [_preset_shorthand(o) for o in overrides]
    try:
        base = OmegaConf.load(path) if path else OmegaConf.create({})
    except (OSError, OmegaConfBaseException, yaml.YAMLError) as error:
        raise ValueError(f"cannot read the config file {path!r}: {error}") from error
    if not isinstance(OmegaConf.to_container(base), dict):
        raise ValueError(f"{path}: the config must be a mapping of sections (model, data, ...)")
    for item in overrides:
        if "=" not in item:
            raise ValueError(
                f"override {item!r} has no '='; write dotted.key=value, "
                f"e.g. training.micro_batch_size=8"
            )
        try:
            merged = OmegaConf.merge(base, OmegaConf.from_dotlist([item]))
        except (OmegaConfBaseException, yaml.YAMLError) as error:
            raise ValueError(
                f"override {item!r}: {error}; write overrides as dotted.key=value, "
                f"e.g. training.micro_batch_size=8"
            ) from error
        base = merged
    try:
        data = OmegaConf.to_container(base, resolve=True)
    except OmegaConfBaseException as error:
        raise ValueError(f"config interpolation failed: {error}") from error
    return validate(data, env, cuda_devices)


def _preset_shorthand(item: str) -> str:
    key, sep, value = item.partition("=")
    return f"model.preset={value}" if sep and key.strip() == "model" and "[" not in value else item


def validate(
    data: Mapping, env: Mapping[str, str] | None = None, cuda_devices: int | None = None
) -> TrainConfig:
    """The TrainConfig of a plain mapping; resolves the defaults that come from ``env``
    (torchrun's WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
    from the machine's ``cuda_devices`` (default: ``torch.cuda.device_count()``)."""
    env = os.environ if env is None else env
    if not isinstance(data, Mapping):
        raise ValueError(f"the config must be a mapping of sections, got {type(data).__name__}")
    data, lifted = _lift_flat_fsdp_keys(data)
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as error:
        raise ValueError(_explain(error.errors()[0])) from None
    model_source.resolve(cfg)  # a Hugging Face or factory model: its builder and shape
    sources.check_section(cfg)  # may set model.vocab_size from the tokenizer
    _resolve_precision(cfg)
    _resolve_layout(cfg, env)
    _resolve_device(cfg, cuda_devices)
    _resolve_strategy(cfg)
    model_source.check_strategy(cfg)
    _check_tensor_parallel(cfg)
    _check_sub_blocks(cfg, lifted)
    _check_training(cfg)
    return cfg


# ---------------------------------------------------------------- error messages


def _explain(err: dict) -> str:
    loc = [str(part) for part in err["loc"]]
    path = ".".join(loc)
    if err["type"] == "extra_forbidden":
        return _unknown_key(path)
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] == "missing":
        return f"{path}: required but missing; add it to the config"
    return f"{path}: invalid value {value!r}: {msg}. Fix it in the YAML or override {path}=..."


def _known_paths(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        names = [name]
        if isinstance(info.validation_alias, AliasChoices):
            names = [str(a) for a in info.validation_alias.choices]
        for alias in names:
            paths.append(prefix + alias)
        sub = info.annotation
        for candidate in getattr(sub, "__args__", (sub,)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                paths += _known_paths(candidate, f"{prefix}{name}.")
    return paths


def schema_keys(model: type[BaseModel] = TrainConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of the config as a dotted path, with its default (before the validation
    resolves it): what docs/config.md documents, one row each."""
    keys: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        sub = [
            c
            for c in getattr(info.annotation, "__args__", (info.annotation,))
            if isinstance(c, type) and issubclass(c, BaseModel)
        ]
        if sub:
            keys.update(schema_keys(sub[0], f"{prefix}{name}."))
        else:
            keys[prefix + name] = info.get_default(call_default_factory=True)
    return keys


def _unknown_key(path: str, valid: Sequence[str] | None = None) -> str:
    parent, _, key = path.rpartition(".")
    if valid is None:
        valid = [p for p in _known_paths() if p.rpartition(".")[0] == parent]
        if parent == "distributed":
            valid += [f"distributed.{k}" for k in FLAT_FSDP_KEYS]
    names = {v.rpartition(".")[2]: v for v in valid}
    if key in names:  # a field given under two of its names (batch_size, micro_batch_size)
        return f"{path} is given twice, under two names of the same setting; keep one of them"
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    hint = f" Did you mean '{names[close[0]]}'?" if close else ""
    listed = ", ".join(sorted(names))
    return f"unknown key '{path}'.{hint} Valid keys under '{parent or '(top)'}': {listed}"


def _check_keys(path: str, given: Mapping, valid: Sequence[str]) -> None:
    for key in given:
        if key not in valid:
            raise ValueError(_unknown_key(f"{path}.{key}", [f"{path}.{k}" for k in valid]))


# ---------------------------------------------------------------- resolution and rules


def _lift_flat_fsdp_keys(data: Mapping) -> tuple[dict, list[str]]:
    """FSDP configs often write their keys directly under ``distributed:``; move them into
    ``fsdp:``."""
    data = dict(data)
    dist = data.get("distributed")
    if not isinstance(dist, Mapping) or not any(k in dist for k in FLAT_FSDP_KEYS):
        return data, []
    dist = dict(dist)
    block = dict(dist.get("fsdp") or {})
    lifted = [key for key in FLAT_FSDP_KEYS if key in dist]
    for key in lifted:
        value = dist.pop(key)
        if key in block and block[key] != value:
            raise ValueError(
                f"distributed.{key}={value!r} conflicts with distributed.fsdp.{key}="
                f"{block[key]!r}; set it in one place"
            )
        block[key] = value
    dist["fsdp"] = block
    data["distributed"] = dist
    return data, lifted


def _resolve_precision(cfg: TrainConfig) -> None:
    t, d = cfg.training, cfg.distributed
    given = {}
    if t.bf16 is not None:
        given["training.bf16"] = "bf16" if t.bf16 else "no"
    if t.mixed_precision is not None:
        given["training.mixed_precision"] = t.mixed_precision
    if d.mixed_precision is not None:
        given["distributed.mixed_precision"] = d.mixed_precision
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{k} -> {v}" for k, v in given.items())
        raise ValueError(
            f"mixed precision is set inconsistently ({listed}); set only "
            f"training.mixed_precision (one of {', '.join(PRECISIONS)})"
        )
    t.mixed_precision = next(iter(given.values()), "no")


def _mesh_value(key: str, mesh, names=None) -> tuple[str, list[int], list[str]]:
    """``[[sizes], [names]]``, or sizes plus the distributed config's ``mesh_axis_names``, as
    (key, sizes, names): only the value's shape is read here; the C++ ``ParallelLayout`` checks
    the sizes and names."""
    example = 'e.g. [[2, 1], ["fsdp", "tp"]]'
    if names is not None and mesh is not None and all(isinstance(s, int) for s in mesh):
        mesh = [list(mesh), list(names)]
    try:
        sizes, axes = mesh
        sizes, axes = list(sizes), [str(a) for a in axes]
    except (TypeError, ValueError):
        raise ValueError(
            f"{key}: invalid value {mesh!r}; write [[sizes...], [axis names...]], {example}"
        ) from None
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise ValueError(f"{key}: size {size!r} in {mesh!r} must be a positive integer")
    return key, sizes, axes


def _given_meshes(cfg: TrainConfig) -> list[tuple[str, list[int], list[str]]]:
    """Each mesh the config writes (model.mesh_shape, distributed.mesh_shape)."""
    d, found = cfg.distributed, []
    if cfg.model.mesh_shape is not None:
        found.append(_mesh_value("model.mesh_shape", cfg.model.mesh_shape))
    if d.mesh_shape is not None:
        found.append(_mesh_value("distributed.mesh_shape", d.mesh_shape, d.mesh_axis_names))
    elif d.mesh_axis_names is not None:
        raise ValueError(
            "distributed.mesh_axis_names is set without distributed.mesh_shape; "
            "set both, or write model.mesh_shape: [[sizes], [names]]"
        )
    return found


def _from_env(key: str, given: int | None, env: Mapping, var: str) -> int | None:
    """The explicit value, else torchrun's variable; both given must agree."""
    raw = env.get(var)
    if raw is None or raw == "":
        return given
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None
    if given is not None and given != value:
        raise ValueError(
            f"{key}={given} but the launcher set {var}={value}; remove {key} "
            f"from the config or launch with a matching {var}"
        )
    return value


def _resolve_layout(cfg: TrainConfig, env: Mapping) -> None:
    """The distributed config's rules: world_size == num_nodes × num_processes_per_node, tensor
    × pipeline parallel <= world_size, rank < world_size; plus the mesh's product == world_size."""
    d = cfg.distributed
    launch = ("world_size", "rank", "master_addr", "master_port")
    d._launch_given = {k for k in launch if getattr(d, k) is not None}
    meshes = _given_meshes(cfg)
    world = _from_env("distributed.world_size", d.world_size, env, "WORLD_SIZE")
    if world is None:
        world = (d.num_nodes or 1) * (d.num_processes_per_node or 1)
    d.world_size = world
    if d.num_processes_per_node is None and env.get("LOCAL_WORLD_SIZE"):
        d.num_processes_per_node = int(env["LOCAL_WORLD_SIZE"])
    if d.num_processes_per_node is None:
        d.num_processes_per_node = max(1, world // (d.num_nodes or 1))
    if d.num_nodes is None:
        d.num_nodes = max(1, world // d.num_processes_per_node)
    if world != d.num_nodes * d.num_processes_per_node:
        raise ValueError(
            f"rule world_size == num_nodes * num_processes_per_node violated: "
            f"distributed.world_size={world} but distributed.num_nodes={d.num_nodes} × "
            f"distributed.num_processes_per_node={d.num_processes_per_node} = "
            f"{d.num_nodes * d.num_processes_per_node}; fix one of the three"
        )
    d.rank = _from_env("distributed.rank", d.rank, env, "RANK") or 0
    d.local_rank = _from_env("distributed.local_rank", d.local_rank, env, "LOCAL_RANK") or 0
    if d.rank >= world:
        raise ValueError(
            f"rule rank < world_size violated: distributed.rank={d.rank} with "
            f"world_size={world}; ranks run 0..{world - 1}"
        )
    if d.local_rank >= d.num_processes_per_node:
        raise ValueError(
            f"distributed.local_rank={d.local_rank} must be < "
            f"num_processes_per_node={d.num_processes_per_node}"
        )
    d.master_addr = d.master_addr or env.get("MASTER_ADDR") or None
    if d.master_port is None and env.get("MASTER_PORT"):
        d.master_port = int(env["MASTER_PORT"])
    # every mesh rule, once (csrc/mesh/parallel_layout.h); the sizes are read from it after
    layout = _C.ParallelLayout(
        world, meshes, d.tensor_parallel_size or 0, d.pipeline_parallel_size or 0
    )
    cfg._layout = layout
    d.tensor_parallel_size = layout.tensor_parallel_size
    d.pipeline_parallel_size = layout.pipeline_parallel_size
    if d.enabled is False and world > 1:
        raise ValueError(
            f"distributed.enabled=false but world_size={world}; set "
            f"distributed.enabled=true or launch one process"
        )
    d.enabled = world > 1 if d.enabled is None else d.enabled


def _resolve_device(cfg: TrainConfig, cuda_devices: int | None) -> None:
    """training.device and distributed.backend against the machine (``device.py``'s rules)."""
    import torch

    count = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    t, d = cfg.training, cfg.distributed
    t.device = device_mod.resolve_device(t.device, count)
    d.backend = d.backend or device_mod.default_backend(t.device, count, d.num_processes_per_node)
    device_mod.check_backend(d.backend, t.device, count, d.num_processes_per_node)


def _resolve_strategy(cfg: TrainConfig) -> None:
    """The explicit strategy, else: a pp axis > 1 -> pipeline; an fsdp block (or the FSDP key
    use_fsdp) -> fsdp; a zero block -> zero; an fsdp mesh axis > 1 -> fsdp; else ddp."""
    d = cfg.distributed
    use_fsdp = (d.fsdp or {}).get("use_fsdp", d.fsdp is not None)
    fsdp_axis = cfg.layout().axis_size("fsdp")
    if d.strategy is None:
        if d.pipeline_parallel_size > 1:
            d.strategy = "pipeline"
        elif use_fsdp:
            d.strategy = "fsdp"
        elif d.zero is not None:
            d.strategy = "zero"
        else:
            d.strategy = "fsdp" if fsdp_axis > 1 else "ddp"
    if d.pipeline_parallel_size > 1 and d.strategy != "pipeline":
        raise ValueError(
            f"distributed.strategy={d.strategy} but pipeline_parallel_size="
            f"{d.pipeline_parallel_size}; set distributed.strategy=pipeline or the pp axis to 1"
        )
    if use_fsdp and d.strategy not in ("fsdp", "pipeline"):
        raise ValueError(
            f"distributed.use_fsdp/fsdp is set but distributed.strategy="
            f"{d.strategy}; drop the fsdp keys or set distributed.strategy=fsdp"
        )
    if d.zero is not None and d.strategy != "zero":
        raise ValueError(
            f"distributed.zero is set but distributed.strategy={d.strategy}; "
            f"drop distributed.zero or set distributed.strategy=zero"
        )
    if d.pipeline is not None and d.strategy != "pipeline":
        raise ValueError(
            f"distributed.pipeline is set but distributed.strategy={d.strategy}; "
            f"drop it or set distributed.strategy=pipeline"
        )
    if d.strategy == "pipeline" and d.pipeline is None:
        d.pipeline = PipelineSection()


def _check_tensor_parallel(cfg: TrainConfig) -> None:
    """tp > 1: the data axis's name and size for the strategy over it (ddp, fsdp, zero, or the
    pipeline's stages), and every dimension the tp size must divide, before any process
    starts."""
    d = cfg.distributed
    tp = d.tensor_parallel_size
    key = cfg.layout().mesh_key or "distributed.tensor_parallel_size"
    if d.sequence_parallel_save_gathered and not d.sequence_parallel:
        raise ValueError(
            "distributed.sequence_parallel_save_gathered=true needs "
            "distributed.sequence_parallel=true; set it or drop sequence_parallel_save_gathered"
        )
    if tp == 1:
        if d.sequence_parallel:
            raise ValueError(
                "distributed.sequence_parallel=true needs tensor parallelism (a tp axis > 1); "
                "set distributed.tensor_parallel_size or drop sequence_parallel"
            )
        return
    layout = cfg.layout()
    if d.strategy == "pipeline":
        p = d.pipeline
        if p.schedule == "zb_h1":
            raise ValueError(
                "distributed.pipeline: with tensor parallelism use a schedule other than zb_h1 "
                "(its deferred weight gradients are plain nn.Linear's, not tp layers')"
            )
    data = layout.data_parallel_size
    if d.strategy == "fsdp":
        if layout.axis_size("dp") > 1:
            raise ValueError(
                f"{key}: the data axis is named 'dp' but distributed.strategy=fsdp; name it "
                f"'fsdp' (e.g. [[{data}, {tp}], ['fsdp', 'tp']]) or use strategy ddp"
            )
        if data == 1:
            raise ValueError(
                f"{key}: FSDP over a data axis of size 1 shards nothing; use strategy ddp with "
                f"tp={tp}, or launch more processes for an fsdp axis > 1"
            )
        sharding = cfg.fsdp_config().fsdp_sharding_strategy
        if sharding not in ("full_shard", "shard_grad_op"):
            raise ValueError(
                f"distributed.fsdp.fsdp_sharding_strategy={sharding} with tensor parallelism is "
                "not supported yet; use full_shard or shard_grad_op"
            )
    elif layout.axis_size("fsdp") > 1 and d.strategy != "pipeline":  # pipeline stages may shard
        raise ValueError(
            f"{key}: the data axis is named 'fsdp' but distributed.strategy={d.strategy}; name "
            f"it 'dp' or use strategy fsdp"
        )
    if d.strategy == "zero" and data == 1:
        raise ValueError(
            f"{key}: ZeRO over a data axis of size 1 partitions nothing; use strategy ddp with "
            f"tp={tp}, or launch more processes for a dp axis > 1"
        )
    if cfg.model._builder is not None:
        return  # model_source.check_strategy checked the model's own sizes
    gpt = cfg.gpt_config()
    seq = cfg.data.seq_len or gpt.seq_len
    dims = [
        ("model.heads", gpt.heads),
        ("model.vocab_size", gpt.vocab_size),
        ("model.dim", gpt.dim),
        ("model.dim × model.mlp_ratio", gpt.dim * gpt.mlp_ratio),
    ]
    if d.sequence_parallel:
        dims.append(("data.seq_len (sequence parallelism)", seq))
    for name, value in dims:
        if value % tp:
            raise ValueError(
                f"{key}: {name} = {value} is not divisible by the tensor-parallel size {tp}; "
                f"choose a tp size that divides {value} or change {name.split(' ')[0]}"
            )


def _check_zero_against_training(cfg: TrainConfig) -> None:
    """Values the trainer drives itself (the lr each step, unless the DeepSpeed config has a
    scheduler; the clipping) must not differ between the two sections: one would be ignored."""
    zero, t = cfg.distributed.zero, cfg.training
    optimizer = zero.get("optimizer")
    params = optimizer.get("params", {}) if isinstance(optimizer, dict) else {}
    lr = params.get("lr") if isinstance(params, dict) else None
    if lr not in (None, "auto") and "scheduler" not in zero and lr != cfg.scaled_learning_rate:
        raise ValueError(
            f"distributed.zero.optimizer.params.lr={lr!r} differs from the trainer's learning "
            f"rate {cfg.scaled_learning_rate!r} (training.learning_rate, scaled), which sets the "
            'lr every step; set it once (training.learning_rate, or "auto"), or give the '
            "DeepSpeed config a scheduler"
        )
    clip = zero.get("gradient_clipping")
    if clip not in (None, "auto") and float(clip) != float(t.gradient_clip_norm or 0.0):
        raise ValueError(
            f"distributed.zero.gradient_clipping={clip!r} differs from "
            f"training.gradient_clip_norm={t.gradient_clip_norm!r}; set it once"
        )


def _zero_mapping(cfg: TrainConfig) -> dict:
    t = cfg.training
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        **(cfg.distributed.zero or {}),
    }


def _delegate(path: str, check) -> Any:
    """Runs another module's validator; its ValueError gets the dotted path in front."""
    try:
        return check()
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _check_sub_blocks(cfg: TrainConfig, lifted: Sequence[str]) -> None:
    d, t = cfg.distributed, cfg.training
    _check_hybrid_mesh(cfg)
    if d.fsdp is not None:
        _check_keys("distributed.fsdp", d.fsdp, FSDP_KEYS)
        try:
            cfg.fsdp_config()
        except ValueError as error:  # FSDPConfig's messages start with the key they are about
            key = str(error).replace(":", " ").split(" ", 1)[0]
            where = "distributed" if key in lifted else "distributed.fsdp"
            text = f"{where}.{error}" if key in FSDP_KEYS else f"{where}: {error}"
            raise ValueError(text) from None
    if d.zero is not None:
        _check_keys("distributed.zero", d.zero, sorted(ZERO_TOP_KEYS))
        for key, ours in (
            ("train_micro_batch_size_per_gpu", "micro_batch_size"),
            ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ):
            if key in d.zero and d.zero[key] not in ("auto", getattr(t, ours)):
                raise ValueError(
                    f"distributed.zero.{key}={d.zero[key]!r} differs from training.{ours}="
                    f"{getattr(t, ours)!r}; set it once, under training.{ours}"
                )
        _delegate("distributed.zero", cfg.zero_config)  # types first: the check below compares
        _check_zero_against_training(cfg)
    if d.strategy == "pipeline":
        _check_pipeline(cfg)


def _check_hybrid_mesh(cfg: TrainConfig) -> None:
    """A mesh with both dp and fsdp axes > 1 is hybrid sharding: it runs as FSDP's hybrid_shard
    over that mesh (the mesh handed to FSDP), or is refused with the fix; never silently as
    full sharding over the whole world."""
    d, layout = cfg.distributed, cfg.layout()
    replicas, shards = layout.axis_size("dp"), layout.axis_size("fsdp")
    if replicas == 1 or shards == 1 or d.strategy == "pipeline":
        return
    mesh = cfg.mesh()
    sharding = (d.fsdp or {}).get("fsdp_sharding_strategy")
    if d.strategy != "fsdp" or sharding != "hybrid_shard":
        raise ValueError(
            f"mesh {mesh} has dp and fsdp axes: that is hybrid sharding (replicate across dp, "
            f"shard within fsdp); set distributed.strategy=fsdp and "
            f"distributed.fsdp.fsdp_sharding_strategy=hybrid_shard, or use one data axis"
        )
    d.fsdp = {**d.fsdp, "mesh_shape": [[replicas, shards], ["dp", "fsdp"]]}


def _check_pipeline(cfg: TrainConfig) -> None:
    from .. import pipeline as pp  # the C++ schedule builder; pure, no process group

    p, stages = cfg.distributed.pipeline, cfg.distributed.pipeline_parallel_size
    if p.num_microbatches is None:
        p.num_microbatches = stages
    if p.schedule == "zb_h1" and cfg.layout().axis_size("fsdp") > 1:
        raise ValueError(
            "distributed.pipeline.schedule=zb_h1 with an fsdp x pp mesh: FSDP reduces gradients "
            "during the backward, which ZB-H1 splits; use schedule 1f1b, or a dp x pp mesh"
        )
    _delegate(
        "distributed.pipeline",
        lambda: pp.make_schedule(p.schedule, stages, p.num_microbatches, p.virtual_stages),
    )


def _check_sync_every(cfg: TrainConfig) -> None:
    t, strategy = cfg.training, cfg.distributed.strategy
    every = t.sync_gradients_every
    if every is None:
        return
    if t.gradient_accumulation_steps % every:
        raise ValueError(
            f"training.sync_gradients_every={every} must divide "
            f"training.gradient_accumulation_steps={t.gradient_accumulation_steps}"
        )
    if strategy in ("zero", "pipeline") and every != t.gradient_accumulation_steps:
        how = (
            "ZeRO reduces every micro-batch into its partition, as DeepSpeed does"
            if strategy == "zero"
            else "the pipeline reduces once per step, after its schedule"
        )
        raise ValueError(
            f"training.sync_gradients_every applies to ddp and fsdp: {how}; leave it out"
        )


def _check_training(cfg: TrainConfig) -> None:
    _check_sync_every(cfg)
    if cfg.training.profile_communication and "shardwise" not in cfg.distributed.backend:
        raise ValueError(
            f"training.profile_communication counts the shardwise backend's operations; "
            f"distributed.backend={cfg.distributed.backend} does not report them: use shardwise"
        )
    t, gpt = cfg.training, cfg.model.gpt()
    if gpt.dim % gpt.heads:
        raise ValueError(
            f"model.dim={gpt.dim} is not a multiple of model.heads={gpt.heads}; change one of them"
        )
    if cfg.data.seq_len is not None and cfg.data.seq_len > gpt.seq_len:
        raise ValueError(
            f"data.seq_len={cfg.data.seq_len} exceeds the model's seq_len={gpt.seq_len} "
            f"(its position embeddings); lower data.seq_len or set model.seq_len"
        )
    if t.lr_scaling != "none" and t.base_batch_size is None:
        raise ValueError(
            f"training.lr_scaling={t.lr_scaling} needs training.base_batch_size (the batch "
            f"size training.learning_rate was tuned for); set it or use lr_scaling=none"
        )
    if t.warmup_steps > t.max_steps:
        raise ValueError(
            f"training.warmup_steps={t.warmup_steps} exceeds training.max_steps="
            f"{t.max_steps}; lower the warm-up"
        )
