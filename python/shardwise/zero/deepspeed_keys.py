"""DeepSpeed's documented config keys (https://www.deepspeed.ai/docs/config-json/ and
deepspeed/runtime/zero/config.py), sorted into what ``shardwise.zero`` implements (with DeepSpeed's
defaults) and what it accepts and ignores (with what is lost). ``config.py`` reads these tables;
a key in neither is a misspelling and gets "did you mean"."""

from __future__ import annotations

# Implemented, with DeepSpeed's defaults.
TOP = {
    "train_batch_size": None,
    "train_micro_batch_size_per_gpu": None,
    "gradient_accumulation_steps": None,
    "gradient_clipping": 0.0,
    "prescale_gradients": False,
    "gradient_predivide_factor": 1.0,
    "bf16": {},
    "fp16": {},
    "zero_optimization": {},
    "optimizer": {},
    "scheduler": None,
}
ZERO = {
    "stage": 0,
    "overlap_comm": True,
    "contiguous_gradients": True,
    "reduce_scatter": True,
    "allgather_partitions": True,
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "offload_optimizer": None,
    "offload_param": None,
    "cpu_offload": None,  # deprecated: offload_optimizer {device: cpu}
    "cpu_offload_param": None,  # deprecated: offload_param {device: cpu}
    "cpu_offload_params": None,  # the spelling older DeepSpeed docs used
    # ZeRO++'s hpZ: stage 3 keeps a secondary partition of the parameters over groups of this
    # many consecutive ranks after forward; backward all-gathers within them (0 or 1: off)
    "zero_hpz_partition_size": 1,
    # ZeRO++'s qwZ: stage 3 all-gathers the parameters as int8 with a scale per block
    "zero_quantized_weights": False,
    # ZeRO++'s qgZ: stage 3 reduce-scatters the gradients as int8 blocks (an all-to-all)
    "zero_quantized_gradients": False,
}
OFFLOAD_OPTIMIZER = {"device": "none", "pin_memory": False}
OFFLOAD_PARAM = {"device": "none", "pin_memory": False}
OFFLOAD_DEVICES = ("none", "cpu")
BF16 = {"enabled": False}
FP16 = {
    "enabled": False,
    "loss_scale": 0.0,  # 0: dynamic
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1.0,
}
OPTIMIZER_TYPES = {
    "adamw": "adamw",
    "adam": "adamw",
    "sgd": "sgd",
    "lamb": "lamb",
}  # DeepSpeed's Adam decouples
OPTIMIZER_PARAMS = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "momentum": 0.0,
    "dampening": 0.0,
    "nesterov": False,
    "adam_w_mode": True,  # DeepSpeed's Adam: decoupled weight decay unless false
    "bias_correction": True,
    "amsgrad": False,
    "torch_adam": False,  # which implementation DeepSpeed picks: nothing to choose here
    "fused": None,
    "foreach": None,
    # DeepSpeed's Lamb (FusedLamb's arguments)
    "eps_inside_sqrt": False,
    "max_grad_norm": 0.0,
    "max_coeff": 10.0,
    "min_coeff": 0.01,
}
# what each optimizer type reads of OPTIMIZER_PARAMS (the rest, given, is named as ignored)
OPTIMIZER_READS = {
    "adamw": ("lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction", "amsgrad"),
    "sgd": ("lr", "weight_decay", "momentum", "dampening", "nesterov"),
    "lamb": ("lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt",
             "max_grad_norm", "max_coeff", "min_coeff"),
}  # fmt: skip
SCHEDULER_TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
_WARMUP = ("warmup_num_steps", "warmup_type", "last_batch_iteration")
SCHEDULER_KEYS = {  # what each DeepSpeed scheduler's constructor takes
    "WarmupLR": ("warmup_min_lr", "warmup_max_lr", *_WARMUP),
    "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr", "total_num_steps", *_WARMUP),
    "WarmupCosineLR": ("total_num_steps", "warmup_min_ratio", "cos_min_ratio", *_WARMUP),
}
SCHEDULER_PARAMS = {
    "warmup_min_lr": 0.0,
    "warmup_max_lr": None,  # None: the optimizer's lr
    "warmup_num_steps": 1000,
    "warmup_type": "log",
    "total_num_steps": None,
    "warmup_min_ratio": 0.0,
    "cos_min_ratio": 0.0001,
    "last_batch_iteration": -1,
}

# Documented, not implemented: accepted with one warning saying what is ignored.
IGNORED_TOP = {
    "steps_per_print": "DeepSpeed's progress printing",
    "wall_clock_breakdown": "DeepSpeed's timers",
    "dump_state": "DeepSpeed's state dump",
    "memory_breakdown": "DeepSpeed's memory printing",
    "flops_profiler": "DeepSpeed's FLOPs profiler (shardwise-train reports MFU)",
    "tensorboard": "DeepSpeed's monitors (shardwise-train writes TensorBoard itself)",
    "wandb": "DeepSpeed's monitors",
    "csv_monitor": "DeepSpeed's monitors",
    "comet": "DeepSpeed's monitors",
    "comms_logger": "DeepSpeed's communication logger",
    "activation_checkpointing": "DeepSpeed's activation-checkpointing API "
    "(use training.gradient_checkpointing)",
    "data_efficiency": "data sampling and routing",
    "autotuning": "the autotuner",
    "aio": "NVMe I/O settings",
    "checkpoint": "DeepSpeed's checkpoint options",
    "data_types": "gradient accumulation dtypes (gradients accumulate in the parameters' dtype)",
    "zero_allow_untested_optimizer": "the untested-optimizer guard",
    "zero_force_ds_cpu_optimizer": "DeepSpeed's CPU Adam choice",
    "communication_data_type": "the reduction dtype (gradients reduce in the parameters' dtype)",
    "disable_allgather": "the broadcast alternative to all-gather",
    "seq_parallel_communication_data_type": "Ulysses sequence parallelism",
    "pipeline": "DeepSpeed's pipeline engine (use shardwise.pipeline)",
    "hybrid_engine": "the RLHF hybrid engine",
    "timers": "DeepSpeed's timers",
    "weight_quantization": "weight quantization",
    "compile": "DeepSpeed's torch.compile wrapper",
    "torch_autocast": "DeepSpeed's autocast wrapper (use bf16 or fp16)",
}
IGNORED_ZERO = {
    "load_from_fp32_weights": "checkpoints always hold fp32 master weights",
    "elastic_checkpoint": "no longer supported by DeepSpeed either",
    "sub_group_size": "ZeRO-Infinity's tiling",
    "stage3_max_live_parameters": "stage 3 keeps at most two units gathered",
    "stage3_max_reuse_distance": "stage 3 reshards after each unit",
    "stage3_param_persistence_threshold": "small parameters are sharded too",
    "stage3_model_persistence_threshold": "small parameters are sharded too",
    "stage3_gather_16bit_weights_on_model_save": "state dicts are always gathered",
    "stage3_gather_fp16_weights_on_model_save": "state dicts are always gathered",
    "stage3_module_granularity_threshold": "units are transformer blocks",
    "stage3_use_all_reduce_for_fetch_params": "parameters are all-gathered",
    "ignore_unused_parameters": "unused parameters are always allowed",
    "legacy_stage1": "the old stage-1 implementation",
    "round_robin_gradients": "the CPU-offload copy order",
    "zero_quantized_nontrainable_weights": "ZeRO++ quantized weights",
    "memory_efficient_linear": "stage 3's linear layer",
    "pipeline_loading_checkpoint": "pipeline checkpoint loading",
    "override_module_apply": "stage 3's module.apply override",
    "log_trace_cache_warnings": "stage 3's trace cache",
    "enable_sanity_checks": "DeepSpeed's internal checks",
    "use_multi_rank_bucket_allreduce": "the bucket all-reduce variant",
    "cpu_offload_use_pin_memory": "pinning offloaded memory",
    "zenflow": "ZenFlow",
}
IGNORED_OFFLOAD = {
    "nvme_path": "NVMe offload",
    "buffer_count": "NVMe buffers",
    "buffer_size": "NVMe buffers",
    "max_in_cpu": "NVMe offload",
    "fast_init": "NVMe offload",
    "ratio": "partial offload (everything is offloaded)",
    "pipeline_read": "NVMe offload",
    "pipeline_write": "NVMe offload",
    "pipeline": "NVMe offload",
}
IGNORED_FP16 = {
    "auto_cast": "inputs are not cast (the model's parameters are fp16)",
    "consecutive_hysteresis": "hysteresis counts every overflow",
    "fp16_master_weights_and_grads": "master weights stay fp32",
}
IGNORED_BF16 = {
    "immediate_grad_update": "gradients are reduced in buckets",
    "check_grad_overflow": "bf16 needs no overflow check",
}

# Keys DeepSpeed itself has removed and now refuses (DeepSpeedConfigError), with its reason and
# what to use in shardwise instead: refused here too, before any work (tests compare these tables
# with the installed DeepSpeed's own).
REMOVED_TOP = {
    "nebula": "Nebula checkpointing; checkpoints are saved by shardwise's own writer",
    "compression_training": "the compression library",
    "amp": "NVIDIA Apex AMP; use bf16 or fp16",
    "quantize_training": "Mixture-of-Quantization",
    "sparse_gradients": "sparse compression of dense embedding gradients",
    "eigenvalue": "eigenvalue-based Mixture-of-Quantization",
    "sparse_attention": "the sparse attention kernels",
    "elasticity": "elastic training; set the batch sizes directly",
    "graph_harvesting": "graph harvesting",
    "curriculum_learning": "the top-level curriculum learning (DeepSpeed moved it under "
    "data_efficiency)",
    "progressive_layer_drop": "progressive layer dropping",
}
REMOVED_ZERO = {
    "mics_shard_size": "MiCS sharding; shard within groups and replicate across them with "
    "shardwise's FSDP hybrid_shard (mesh_shape [[replicas, shards], ['dp', 'fsdp']])",
    "mics_hierarchical_params_gather": "MiCS sharding; see mics_shard_size",
    "zeropp_loco_param": "LoCo-ZeRO++; remove the key",
}

# Where Hugging Face's Trainer fills DeepSpeed's "auto" values from, by key path: the name of
# the value in the ``auto`` mapping ``load`` takes.
AUTO_SOURCES = {
    "train_micro_batch_size_per_gpu": "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "train_batch_size": "train_batch_size",
    "gradient_clipping": "gradient_clipping",
    "fp16.enabled": "fp16",
    "bf16.enabled": "bf16",
    "optimizer.params.lr": "lr",
    "optimizer.params.betas": "betas",
    "optimizer.params.eps": "eps",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "warmup_min_lr",
    "scheduler.params.warmup_max_lr": "lr",
    "scheduler.params.warmup_num_steps": "warmup_num_steps",
    "scheduler.params.total_num_steps": "total_num_steps",
    "zero_optimization.reduce_bucket_size": "reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold": "stage3_param_persistence_threshold",
}


def auto_from_hidden_size(hidden: int) -> dict:
    """Hugging Face's rule for the bucket sizes from the model's hidden size."""
    return {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }
