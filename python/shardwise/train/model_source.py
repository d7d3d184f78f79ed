"""The ``model:`` section beyond the bundled GPT: a Hugging Face config (``hf_config``, sized by
``hf_overrides``), pretrained local weights (``pretrained``) or a factory (``factory``,
``factory_args``), checked at validation and turned into a ``models.causal_lm.ModelBuilder``
and the ``ModelShape`` the planner and the metrics read."""

from __future__ import annotations

from pathlib import Path

from ..models.causal_lm import ModelBuilder, ModuleBuilder

GPT_ONLY = ("dim", "layers", "heads", "mlp_ratio", "dropout", "vocab_size")
DEFAULT_SEQ_LEN = 2048


def resolve(cfg, module=None) -> None:
    """Sets ``cfg.model``'s builder and shape when it names a model other than the GPT, or when
    ``module`` (a model the caller built: ``shardwise.Trainer(model, ...)``) is given."""
    m = cfg.model
    hf = m.hf_config is not None or m.pretrained is not None
    if module is not None:
        return _resolve_module(cfg, module)
    if not hf and m.factory is None:
        if m.hf_overrides:
            raise ValueError("model.hf_overrides needs model.hf_config (or model.pretrained)")
        if m.factory_args:
            raise ValueError("model.factory_args needs model.factory")
        return
    if m.pretrained is not None and not Path(m.pretrained).expanduser().is_dir():
        raise ValueError(
            f"model.pretrained: {m.pretrained} is not a folder; give a local folder saved with "
            "save_pretrained (config.json and .safetensors weights)"
        )
    if hf and m.factory is not None:
        raise ValueError("model.factory and model.hf_config/pretrained name two models; give one")
    sizes = "model.hf_overrides (e.g. n_layer, hidden_size)" if hf else "model.factory_args"
    given = [k for k in GPT_ONLY if getattr(m, k) is not None]
    if given:
        raise ValueError(f"model.{given[0]} sizes the bundled GPT; size this model in {sizes}")
    if hf and m.factory_args:
        raise ValueError(
            "model.factory_args needs model.factory; size a Hugging Face model in "
            "model.hf_overrides"
        )
    builder = ModelBuilder(
        m.hf_config, tuple(sorted((m.hf_overrides or {}).items())), m.pretrained, m.factory,
        tuple(sorted((m.factory_args or {}).items())),
    )  # fmt: skip
    limit = builder.max_positions()  # also reads and checks the Hugging Face config
    # default: the model's context, at most DEFAULT_SEQ_LEN (a released model's 32k-128k
    # context is not what a run without data.seq_len means)
    seq = cfg.data.seq_len or m.seq_len or (limit and min(limit, DEFAULT_SEQ_LEN))
    if seq is None:
        raise ValueError(
            "model.seq_len: give the sequence length the factory's model trains on "
            "(or data.seq_len)"
        )
    if limit is not None and seq > limit:
        raise ValueError(
            f"the sequence length {seq} exceeds the model's max_position_embeddings={limit}; "
            f"lower data.seq_len (or raise it in {sizes})"
        )
    m._builder = builder
    m._shape = builder.shape(seq, 256)


def _resolve_module(cfg, module) -> None:
    m = cfg.model
    named = [k for k in ("hf_config", "pretrained", "factory") if getattr(m, k) is not None]
    given = named + [k for k in (*GPT_ONLY, "hf_overrides", "factory_args") if getattr(m, k)]
    if given:
        raise ValueError(
            f"model.{given[0]} configures a model, but the Trainer was given one (model=); "
            "drop the model section's keys, or the model argument"
        )
    builder = ModuleBuilder(module)
    seq = cfg.data.seq_len or m.seq_len
    if seq is None:
        raise ValueError("data.seq_len: give the sequence length the model trains on")
    limit = builder.max_positions()
    if limit is not None and seq > limit:
        raise ValueError(
            f"the sequence length {seq} exceeds the model's max_position_embeddings={limit}; "
            "give shorter items (or a lower data.seq_len)"
        )
    m._builder = builder
    m._shape = builder.shape(seq, 256)


def check_strategy(cfg) -> None:
    """Tensor parallelism and the pipeline split need a model whose structure shardwise knows:
    the bundled GPT, or a Hugging Face model of a family with a plan (``hf_plans``, for tp) and
    blocks (``hf_stages``, for the pipeline); every size the tp size must divide, named as the
    model's config names it."""
    m, d = cfg.model, cfg.distributed
    if m._builder is None:
        return
    tp, pipeline = d.tensor_parallel_size > 1, d.strategy == "pipeline"
    if not (tp or pipeline):
        return
    what = "tensor parallelism" if tp else "the pipeline strategy"
    config = m._builder.config()
    if config is None:
        raise ValueError(
            f"{what} with model.factory (or a model passed to the Trainer that is not a Hugging "
            "Face model) is not supported: shardwise cuts only models whose "
            "structure it knows (the bundled GPT; Hugging Face gpt2 and llama models); use "
            "ddp, fsdp or zero for this model"
        )
    from ..pipeline import hf_stages
    from ..tensor_parallel import hf_plans

    kind = getattr(config, "model_type", None)
    if pipeline and hf_stages.family(config) is None:
        raise ValueError(
            f"the pipeline strategy has no split for model_type {kind!r} (it covers "
            f"{', '.join(sorted(hf_stages.FAMILIES))}); use ddp, fsdp or zero for this model"
        )
    if not tp:
        return
    if d.sequence_parallel:
        raise ValueError(
            "distributed.sequence_parallel with a Hugging Face model is not supported (its "
            "norms and residuals run in its own forward); drop sequence_parallel"
        )
    try:
        sizes = hf_plans.divisible_sizes(config)
    except ValueError as error:
        raise ValueError(f"{error}; or use ddp, fsdp or zero without a tp axis") from None
    for field, value in sizes:
        if value % d.tensor_parallel_size:
            raise ValueError(
                f"distributed.tensor_parallel_size: the model's {field} = {value} is not "
                f"divisible by the tensor-parallel size {d.tensor_parallel_size}; choose a tp "
                f"size that divides it or change model.hf_overrides.{field}"
            )
