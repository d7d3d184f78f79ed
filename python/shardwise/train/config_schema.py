"""The shape of a ``shardwise-train`` config: its four sections as pydantic models (extra keys
forbidden), ``TrainConfig`` with what it derives (batch sizes, the learning rate, the layout, the
FSDP and ZeRO sub-configs), and the key paths and messages for keys that do not exist.
``config.py`` loads and validates a file into it; ``config_rules.py`` holds the cross-field rules.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Literal

from omegaconf import OmegaConf
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
)

from .. import _C
from ..fsdp.config import FSDPConfig
from ..mesh import mesh_spec
from ..models.families import FAMILIES
from ..models.gpt import PRESETS, GPTConfig
from ..zero.config import load as load_zero
from ..zero.deepspeed_keys import auto_from_hidden_size
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
            close = difflib.get_close_matches(value, [*PRESETS, *FAMILIES], n=1)
            raise ValueError(
                f"unknown preset; valid presets: {', '.join(PRESETS)}; model families "
                f"(model=NAME, or model.hf_config): {', '.join(FAMILIES)}"
                + (f"; did you mean {close[0]}?" if close else "")
            )
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
    # before step 1: save the state and load it back, bit for bit (train/checkpoint_verify.py)
    verify_at_start: bool = False
    # the state copied to host memory, then written by a background writer while training
    # goes on (train/async_checkpoint.py); also spelled async
    asynchronous: bool = Field(False, validation_alias=AliasChoices("async", "asynchronous"))


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
    compile: bool = False
    # bitwise-identical training at every data-parallel size (docs/deterministic.md): micro-
    # batch m of a global batch is the same samples whatever rank computes it, the gradients
    # of the global batch's micro-batches are summed in one tree over m, one intra-op thread
    deterministic: bool = False
    # the update: AdamW, or LAMB (DeepSpeed's FusedLamb: AdamW's direction scaled per parameter
    # by ||param|| / ||direction||, for large batches); betas and weight decay shared
    optimizer: Literal["adamw", "lamb"] = "adamw"
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
    # the price of one device (a GPU, or a CPU process) for an hour: the metrics' cost
    device_hour_price: float | None = Field(None, ge=0)
    # ranks on devices of different kinds (name, compute capability, memory; CPU model, cores)
    # go on with a warning instead of an error (train/device_check.py)
    allow_mixed_devices: bool = False
    # every this many steps (0: never), the replicated state's copies compared across ranks
    # (train/consistency.py); a difference stops the run or warns
    consistency_every: int = Field(100, ge=0)
    consistency_action: Literal["stop", "warn"] = "stop"

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
    # strategy ddp: gradients all-reduced in this dtype (torch's fp16_compress_hook /
    # bf16_compress_hook, Accelerate's DDPCommunicationHookType): half the bytes; no: fp32
    ddp_comm_hook: Literal["no", "fp16", "bf16"] = "no"
    fsdp: dict[str, Any] | None = None
    zero: dict[str, Any] | None = None  # DeepSpeed's keys, or the path of a ds_config.json
    pipeline: PipelineSection | None = None
    # the launch keys the config itself gave (before the defaults were filled in)
    _launch_given: set = PrivateAttr(default_factory=set)

    _precision = field_validator("mixed_precision", "ddp_comm_hook", mode="before")(_precision_word)

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

    def run_gpt_config(self) -> GPTConfig:
        """The model as the run builds it: ``data.seq_len``, when given, is its sequence length."""
        gpt = self.gpt_config()
        return replace(gpt, seq_len=self.data.seq_len) if self.data.seq_len else gpt

    @property
    def data_seed(self) -> int:
        """The order of the batches: ``data.shuffle_seed``, else ``training.seed``."""
        shuffle = self.data.shuffle_seed
        return self.training.seed if shuffle is None else shuffle

    @property
    def activation_checkpointing(self) -> bool:
        """Whether blocks recompute their activations in backward: ``training.
        gradient_checkpointing`` or ``distributed.fsdp.gradient_checkpointing``; either turns it
        on."""
        fsdp = self.distributed.fsdp
        return self.training.gradient_checkpointing or bool(
            fsdp and self.fsdp_config().gradient_checkpointing
        )

    @property
    def eval_every(self) -> int:
        """Steps between eval losses (``training.eval_every``, default the checkpoint interval;
        0: only at the end)."""
        t = self.training
        return t.checkpoint.every_steps if t.eval_every is None else t.eval_every

    def launch_env(self) -> dict:
        """The job's place as the config gives it, by torchrun's variable names (None: not
        given; torchrun's environment wins)."""
        d = self.distributed
        return {
            "WORLD_SIZE": d.world_size,
            "RANK": d.rank,
            "LOCAL_RANK": d.local_rank,
            "LOCAL_WORLD_SIZE": d.num_processes_per_node,
            "MASTER_ADDR": d.master_addr,
            "MASTER_PORT": d.master_port,
        }

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


def _given_meshes(cfg: TrainConfig) -> list[tuple[str, list[int], list[str]]]:
    """Each mesh the config writes (model.mesh_shape, distributed.mesh_shape)."""
    d, found = cfg.distributed, []
    if cfg.model.mesh_shape is not None:
        found.append(mesh_spec(cfg.model.mesh_shape, key="model.mesh_shape"))
    if d.mesh_shape is not None:
        found.append(mesh_spec(d.mesh_shape, d.mesh_axis_names, key="distributed.mesh_shape"))
    elif d.mesh_axis_names is not None:
        raise ValueError(
            "distributed.mesh_axis_names is set without distributed.mesh_shape; "
            "set both, or write model.mesh_shape: [[sizes], [names]]"
        )
    return found


def _zero_mapping(cfg: TrainConfig) -> dict:
    t = cfg.training
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        **(cfg.distributed.zero or {}),
    }
