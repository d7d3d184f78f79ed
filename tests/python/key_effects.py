"""Where each accepted configuration key is shown to take effect, read by
``test_every_key_takes_effect.py``. Keys are ``schema:key``: ``train:`` shardwise-train's config
(dotted paths of ``TrainConfig``; ``distributed.fsdp`` and ``distributed.zero`` are the next two
schemas), ``fsdp:`` the FSDP config keys (``FSDPConfig``'s fields and the other ``distributed:``
keys ``FSDPConfig.from_mapping`` accepts), ``accelerate:`` Accelerate's ``fsdp_config`` spellings,
``deepspeed:`` DeepSpeed's JSON keys (dotted, e.g. ``zero_optimization.overlap_comm``).

- ``EFFECTS``: the tests that fail if the key were ignored (they observe what runs: bytes moved,
  memory held, losses, files written, a refusal where refusing is the key's whole effect). An
  alias counts through two links: a test that it reads as the key it stands for, and that key's
  effect test. A test that only checks the parsed or resolved value does not count.
- ``NO_OPS``: keys accepted, ignored, and named in ``DeepSpeedConfigWarning``, by where the code
  names them (derived from the ``IGNORED_*`` tables; a few are named only for some values).
- ``GAPS``: every other key, with why it is here: no test, only parsing tested, or an engine
  argument tested without the key that sets it. Move a key to ``EFFECTS`` when a test lands.
"""

from __future__ import annotations

from shardwise.zero import deepspeed_keys as _K

TT = "tests/distributed/test_train.py::"
TCK = "tests/distributed/test_train_recovery.py::"
TK = "tests/distributed/test_train_keys.py::"
TTP = "tests/distributed/test_train_tp.py::"
TTM = "tests/distributed/test_train_models.py::"
ZC = "tests/distributed/zero_checks.py::"
ZPC = "tests/distributed/zeropp_checks.py::"
FC = "tests/distributed/fsdp_checks.py::"
FE = "tests/distributed/fsdp_effect_checks.py::"
FF = "tests/distributed/fsdp_fidelity_checks.py::"
TC = "tests/python/test_train_config.py::"
TR = "tests/python/test_train_config_rules.py::"
TS = "tests/python/test_train_sources.py::"
TMS = "tests/python/test_train_model_source.py::"
TDV = "tests/python/test_train_device.py::"
TDS = "tests/python/test_deepspeed_config.py::"
TDK = "tests/python/test_deepspeed_removed_and_zeropp_keys.py::"
FT = "tests/python/test_fsdp_torch_args.py::"
CZ = "tests/cpp/torch/test_zero_libtorch.cc::"

_MIXED = TT + "test_training_mixed_precision_sets_the_collectives_dtype"
_BY_HAND = TT + "test_processes_launched_by_hand_with_distributed_train_as_torchrun_does"
_HYBRID = TTP + "test_hybrid_mesh_shards_within_the_fsdp_axis"
_STAGE_KEYS = FF + "fsdp_a_pipeline_stage_takes_the_configs_fsdp_keys"
_FP16 = TTP + "test_fp16_loss_scaling_for_every_strategy"
_DS_JSON = TT + "test_a_deepspeed_json_config_trains_with_its_scheduler"
_ONE_ON_TWO = TCK + "test_checkpoint_of_one_rank_loads_on_two"
_LAMB_KEYS = "tests/python/test_lamb.py::test_deepspeeds_lamb_keys_reach_the_engine"
_SCHEDULED = TDS + "test_a_scheduled_engine_trains_like_torch_adamw_under_deepspeeds_scheduler"
_SGD = ZC + "zero_clipping_sgd_and_offload_match_torch"
_REFUSED = TDS + "test_values_that_would_change_training_are_refused"
_WRAP_REFUSES = FT + "test_wrap_refuses_keys_it_would_silently_drop"
_SCHED_PARAMS = TDS + "test_scheduler_params_from_the_config_set_the_engines_lr"
_PIPELINE = TK + "test_pipeline_schedule_and_virtual_stages_are_what_runs"
_PRESCALE = ZC + "zero_prescale_and_predivide_divide_before_the_fp16_reduction"
_SHARE = (
    "tests/python/test_train_planner.py::"
    + "test_processes_per_node_decide_each_ranks_share_of_the_host"
)
_ACCEL = FT + "test_accelerates_fsdp_config_reads_as_the_fsdp_config_keys"
_LR = TK + "test_lr_scaling_and_base_batch_size_set_the_logged_learning_rate"
_MESH = TK + "test_distributed_mesh_shape_lays_out_tensor_parallelism"
_SP = TK + "test_sequence_parallel_reduce_scatters_and_saves_gathered_inputs"
_PROFILED = TK + "test_profile_schedule_records_the_steps_it_names"

EFFECTS: dict[str, tuple[str, ...]] = {
    # ---- shardwise-train
    "train:model.preset": (TT + "test_a_run_that_cannot_fit_is_refused",),
    "train:model.mesh_shape": (_HYBRID, TTP + "test_planner_counts_tp_shards"),
    "train:model.hf_config": (
        TTM + "test_export_loads_with_from_pretrained",
        TMS + "test_a_hugging_face_shape_is_measured",
    ),
    "train:model.hf_overrides": (TMS + "test_a_hugging_face_shape_is_measured",),
    "train:model.pretrained": (TMS + "test_pretrained_weights_load_as_saved",),
    # the named callable builds the model: json:dumps is called and raises
    "train:model.factory": (TMS + "test_bad_model_sections_are_refused_with_the_fix",),
    "train:data.path": (
        TS + "test_nanogpt_folder_uses_its_val_bin",
        TS + "test_val_path_or_the_last_fraction",
    ),
    "train:data.val_path": (TS + "test_val_path_or_the_last_fraction",),
    "train:data.val_fraction": (TS + "test_val_path_or_the_last_fraction",),
    "train:data.tokenizer": (TT + "test_a_jsonl_dataset_with_a_tokenizer_json_trains",),
    "train:data.seq_len": (TTM + "test_export_loads_with_from_pretrained",),
    "train:training.micro_batch_size": (
        _ONE_ON_TWO,
        TCK + "test_sharded_checkpoint_loads_at_another_world_size",
    ),
    "train:training.batch_size": (
        TC + "test_fsdp_config_batch_size_and_micro_batch_size_are_one_setting",
        _ONE_ON_TWO,
    ),
    "train:training.learning_rate": (_DS_JSON,),
    "train:training.warmup_steps": (_DS_JSON,),
    "train:training.bf16": (TC + "test_an_fsdp_config_block_is_accepted_unchanged", _MIXED),
    "train:training.mixed_precision": (_MIXED, _FP16),
    "train:training.initial_loss_scale_power": (_FP16,),
    "train:training.max_steps": (TT + "test_strategy_trains_and_exports",),
    "train:training.eval_every": (
        TT + "test_eval_loss_is_the_exported_models_loss_on_the_validation_batches",
    ),
    "train:training.profile_communication": (
        TT + "test_metrics_measure_each_rank_its_phases_and_its_communication",
    ),
    "train:training.checkpoint.dir": (TT + "test_strategy_trains_and_exports",),
    "train:training.checkpoint.every_steps": (
        TCK + "test_sharded_checkpoint_loads_at_another_world_size",
    ),
    "train:distributed.world_size": (_BY_HAND,),
    "train:distributed.rank": (_BY_HAND,),
    "train:distributed.master_addr": (_BY_HAND,),
    "train:distributed.master_port": (_BY_HAND,),
    "train:distributed.timeout_s": (TC + "test_the_collective_timeout_reaches_the_run",),
    "train:distributed.tensor_parallel_size": (TTM + "test_model_matches_one_process",),
    "train:distributed.mixed_precision": (
        TC + "test_mixed_precision_must_be_set_consistently",
        _MIXED,
    ),
    "train:distributed.ddp_comm_hook": (_MIXED,),
    "train:distributed.pipeline.num_microbatches": (
        TCK + "test_pipeline_checkpoint_resumes_as_ddp_on_one_process",
        TT + "test_eval_loss_is_the_exported_models_loss_on_the_validation_batches",
    ),
    # ---- shardwise-train keys observed in one- and two-process runs
    "train:model.vocab_size": (TK + "test_model_shape_keys_build_the_model_the_run_exports",),
    "train:model.seq_len": (TK + "test_model_shape_keys_build_the_model_the_run_exports",),
    "train:model.dim": (TK + "test_model_shape_keys_build_the_model_the_run_exports",),
    "train:model.layers": (TK + "test_model_shape_keys_build_the_model_the_run_exports",),
    "train:model.mlp_ratio": (TK + "test_model_shape_keys_build_the_model_the_run_exports",),
    "train:model.heads": (TK + "test_model_heads_splits_attention",),
    "train:model.dropout": (TK + "test_model_dropout_drops_in_training_only",),
    "train:model.factory_args": (TK + "test_model_factory_args_reach_the_factory",),
    "train:data.shuffle_seed": (TK + "test_data_shuffle_seed_orders_the_batches",),
    "train:training.seed": (TK + "test_training_seed_initializes_the_model",),
    "train:training.gradient_accumulation_steps": (
        TK + "test_gradient_accumulation_of_two_halves_equals_one_batch",
    ),
    "train:training.sync_gradients_every": (
        TK + "test_sync_gradients_every_reduces_after_each_micro_batch",
    ),
    "train:training.lr_scaling": (_LR,),
    "train:training.base_batch_size": (_LR,),
    "train:training.gradient_clip_norm": (TK + "test_gradient_clip_norm_bounds_the_update",),
    "train:training.gradient_checkpointing": (
        TK + "test_gradient_checkpointing_recomputes_each_block_in_backward",
    ),
    "train:training.optimizer": (
        "tests/distributed/test_train_lamb.py::test_lamb_trains_alike_at_every_world_size",
    ),
    "train:training.compile": (
        "tests/distributed/test_train_compile.py::test_compiled_blocks_train_as_eager",
    ),
    "train:training.deterministic": (
        "tests/distributed/test_train_deterministic.py::test_every_world_size_gives_the_same_bits",
        "tests/distributed/test_train_deterministic.py::test_without_the_mode_the_world_size_shows",
    ),
    "train:training.log_every": (TK + "test_log_every_picks_the_logged_steps",),
    "train:training.device_hour_price": (TK + "test_device_hour_price_prices_the_device_hours",),
    "train:training.checkpoint.asynchronous": (
        TC + "test_checkpoint_async_and_asynchronous_are_one_setting",
        TK + "test_checkpoint_async_trains_on_while_a_slow_writer_writes",
    ),
    "train:training.checkpoint.async": (
        TK + "test_checkpoint_async_trains_on_while_a_slow_writer_writes",
    ),
    "train:training.checkpoint.verify_at_start": (
        TK + "test_checkpoint_verify_at_start_round_trips_before_step_1",
    ),
    "train:training.consistency_every": (
        TK + "test_consistency_every_names_the_corrupted_replica",
    ),
    "train:training.consistency_action": (
        TK + "test_consistency_action_warn_names_a_tensor_parallel_replica_and_goes_on",
    ),
    "train:training.allow_mixed_devices": (
        "tests/python/test_train_device_check.py::"
        "test_allow_mixed_devices_turns_the_refusal_into_a_warning",
    ),
    "train:training.eval_batches": (TK + "test_eval_batches_sets_the_batches_evaluated",),
    "train:training.checkpoint.keep_last": (TK + "test_checkpoint_keep_last_keeps_that_many",),
    "train:distributed.backend": (
        TK + "test_distributed_backend_picks_the_process_groups_backend",
    ),
    "train:distributed.strategy": (TK + "test_distributed_strategy_shards_the_model_state",),
    "train:distributed.mesh_shape": (_MESH,),
    "train:distributed.mesh_axis_names": (_MESH,),
    "train:distributed.sequence_parallel": (_SP,),
    "train:distributed.sequence_parallel_save_gathered": (_SP,),
    **{
        f"train:training.profile.{key}": (_PROFILED,)
        for key in ("wait", "warmup", "active", "record_shapes")
    },
    **{
        f"train:data.{key}": (TS + "test_data_format_dtype_and_text_field_keys_decide_the_tokens",)
        for key in ("format", "dtype", "text_field")
    },
    # ---- FSDP config keys
    "fsdp:fsdp_sharding_strategy": (_STAGE_KEYS, _HYBRID),
    "fsdp:fsdp_state_dict_type": (
        TT + "test_fsdp_state_dict_type_decides_what_the_trainer_exports",
    ),
    "fsdp:fsdp_mixed_precision": (_MIXED, _STAGE_KEYS),
    # fp16 reaches FSDP as fsdp_param_dtype float16: bf16 parameters never overflow at 2**24
    "fsdp:fsdp_param_dtype": (_FP16,),
    "fsdp:mesh_shape": (_HYBRID,),
    "fsdp:tensor_parallel_size": (_WRAP_REFUSES,),
    "fsdp:pipeline_parallel_size": (_WRAP_REFUSES,),
    "fsdp:use_zero": (_WRAP_REFUSES,),
    "fsdp:num_microbatches": (_WRAP_REFUSES,),
    # ---- DeepSpeed JSON keys
    "deepspeed:train_batch_size": (TDS + "test_deepspeed_initialize_returns_its_four_tuple",),
    "deepspeed:gradient_accumulation_steps": (ZC + "zero_accumulation_matches_one_big_batch",),
    "deepspeed:gradient_clipping": (_SGD,),
    "deepspeed:bf16.enabled": (ZC + "zero_memory_matches_the_formulas",),
    "deepspeed:fp16.enabled": (ZC + "zero_fp16_overflow_skips_everywhere",),
    "deepspeed:fp16.initial_scale_power": (ZC + "zero_fp16_overflow_skips_everywhere",),
    "deepspeed:fp16.hysteresis": (ZC + "zero_fp16_overflow_skips_everywhere",),
    "deepspeed:zero_optimization.stage": (ZC + "zero_memory_matches_the_formulas",),
    "deepspeed:optimizer.type": (_SGD, ZC + "zero_lamb_matches_single_process_lamb"),
    "deepspeed:optimizer.params.lr": (ZC + "zero_stage1_matches_single_process",),
    "deepspeed:optimizer.params.weight_decay": (ZC + "zero_stage1_matches_single_process",),
    "deepspeed:optimizer.params.momentum": (_SGD,),
    "deepspeed:optimizer.params.nesterov": (_SGD,),
    # only the fused AdamW's value is accepted: refusing the other is the whole effect
    "deepspeed:optimizer.params.adam_w_mode": (_REFUSED,),
    "deepspeed:optimizer.params.amsgrad": (_REFUSED,),
    "deepspeed:scheduler.type": (_SCHEDULED, _DS_JSON),
    "deepspeed:scheduler.params.warmup_min_lr": (_SCHEDULED,),
    "deepspeed:scheduler.params.warmup_num_steps": (_SCHEDULED, _DS_JSON),
    "deepspeed:scheduler.params.total_num_steps": (_SCHEDULED,),
    "deepspeed:scheduler.params.warmup_type": (_SCHEDULED,),
    # the launch keys wrap() compares with the process group
    **{
        f"fsdp:{key}": (FC + "fsdp_wrap_checks_the_launch_keys_against_the_group",)
        for key in ("world_size", "rank", "backend", "num_nodes", "num_processes_per_node")
    },
    "deepspeed:zero_optimization.allgather_bucket_size": (
        ZC + "zero_allgather_bucket_size_sets_the_parameter_all_gathers",
    ),
    **{
        f"deepspeed:optimizer.params.{key}": (
            TDS + "test_optimizer_params_reach_the_fused_optimizer",
        )
        for key in ("betas", "eps", "dampening")
    },
    **{
        f"deepspeed:fp16.{key}": (TDS + "test_fp16_loss_scale_and_its_floor_reach_the_loss_scaler",)
        for key in ("loss_scale", "min_loss_scale")
    },
    **{
        f"fsdp:{key}": (FE + "fsdp_the_configs_prefetch_and_wrap_keys_run_as_the_arguments",)
        for key in (
            "fsdp_forward_prefetch",
            "fsdp_backward_prefetch",
            "fsdp_auto_wrap_policy",
            "fsdp_transformer_layer_cls",
        )
    },
    # the FSDP keys and Accelerate's spellings through shardwise.wrap (fsdp_effect_checks)
    **{
        key: (FE + "fsdp_the_configs_unit_and_sync_keys_run",)
        for key in (
            "fsdp:use_fsdp",
            "fsdp:fsdp_min_num_params",
            "fsdp:sync_module_states",
            "accelerate:fsdp_sync_module_states",
            "accelerate:fsdp_transformer_layer_cls_to_wrap",
            "accelerate:fsdp_backward_prefetch_policy",
        )
    },
    **{
        key: (FE + "fsdp_the_configs_checkpointing_and_strategy_keys_run",)
        for key in (
            "fsdp:gradient_checkpointing",
            "accelerate:fsdp_activation_checkpointing",
            "accelerate:fsdp_reshard_after_forward",
        )
    },
    **{
        f"fsdp:{key}": (FE + "fsdp_the_configs_precision_keys_cast_buffers_and_reductions",)
        for key in ("fsdp_buffer_dtype", "fsdp_reduce_dtype")
    },
    # DeepSpeed keys read by the engine in one process, against DeepSpeed's own objects
    "deepspeed:optimizer.params.bias_correction": (_REFUSED, _LAMB_KEYS),
    **{
        f"deepspeed:optimizer.params.{key}": (_LAMB_KEYS,)
        for key in ("eps_inside_sqrt", "max_coeff", "min_coeff")
    },
    "deepspeed:optimizer.params.max_grad_norm": (
        "tests/python/test_lamb.py::"
        "test_lamb_max_grad_norm_is_refused_and_lamb_keys_under_adamw_named",
    ),
    "deepspeed:scheduler.params.warmup_max_lr": (_SCHED_PARAMS,),
    "deepspeed:scheduler.params.warmup_min_ratio": (_SCHED_PARAMS,),
    "deepspeed:scheduler.params.cos_min_ratio": (_SCHED_PARAMS,),
    "deepspeed:scheduler.params.last_batch_iteration": (_SCHED_PARAMS,),
    "deepspeed:fp16.loss_scale_window": (
        TDS + "test_fp16_loss_scale_window_grows_the_scale_as_deepspeeds_scaler",
    ),
    "deepspeed:train_micro_batch_size_per_gpu": (
        TDS + "test_train_micro_batch_size_per_gpu_sets_the_loaders_batch",
    ),
    "train:distributed.pipeline.schedule": (_PIPELINE,),
    "train:distributed.pipeline.virtual_stages": (_PIPELINE,),
    "deepspeed:zero_optimization.reduce_bucket_size": (
        ZC + "zero_reduce_bucket_size_sets_the_gradient_reductions",
    ),
    "deepspeed:prescale_gradients": (_PRESCALE,),
    "deepspeed:gradient_predivide_factor": (_PRESCALE,),
    "deepspeed:zero_optimization.overlap_comm": (
        ZC + "zero_overlap_comm_false_waits_for_each_reduction",
    ),
    "deepspeed:zero_optimization.zero_hpz_partition_size": (
        ZPC + "zero_hpz_partition_size_gathers_backward_within_its_group",
        TDK + "test_zero_hpz_partition_size_is_read_as_deepspeed_reads_it",
    ),
    "deepspeed:zero_optimization.zero_quantized_weights": (
        ZPC + "zero_quantized_weights_gathers_int8_with_block_scales",
    ),
    "deepspeed:zero_optimization.zero_quantized_gradients": (
        ZPC + "zero_quantized_gradients_reduce_scatter_int8_blocks",
    ),
    "deepspeed:zero_optimization.stage3_prefetch_bucket_size": (
        ZC + "zero_stage3_prefetch_bucket_size_gathers_the_next_block_ahead",
    ),
    "train:distributed.num_nodes": (_SHARE,),
    "train:distributed.num_processes_per_node": (_SHARE,),
    "train:distributed.enabled": (
        "tests/python/test_train_cli.py::test_the_enabled_key_or_a_larger_world_asks_the_same_as_the_flag",
    ),
    "train:distributed.pipeline_parallel_size": (
        TK + "test_pipeline_parallel_size_cuts_the_model_into_that_many_stages",
    ),
    "train:training.device": (TK + "test_training_device_cuda_is_refused_without_a_gpu",),
    "fsdp:zero_stage": (_WRAP_REFUSES,),
    "fsdp:pipeline_schedule": (_WRAP_REFUSES,),
}

# Documented DeepSpeed keys accepted and named in the one DeepSpeedConfigWarning, by table.
_IGNORED_TABLES = {
    "IGNORED_TOP": ("",),
    "IGNORED_ZERO": ("zero_optimization.",),
    "IGNORED_OFFLOAD": (
        "zero_optimization.offload_optimizer.",
        "zero_optimization.offload_param.",
    ),
    "IGNORED_FP16": ("fp16.",),
    "IGNORED_BF16": ("bf16.",),
}
NO_OPS: dict[str, str] = {
    f"deepspeed:{prefix}{key}": f"python/shardwise/zero/deepspeed_keys.py {table}"
    for table, prefixes in _IGNORED_TABLES.items()
    for prefix in prefixes
    for key in getattr(_K, table)
}
# Implemented only at DeepSpeed's default; any other value is named in the same warning.
NO_OPS.update(
    {
        "deepspeed:zero_optimization.contiguous_gradients": (
            "python/shardwise/zero/config.py _unimplemented_choices (named when false)"
        ),
        "deepspeed:zero_optimization.reduce_scatter": (
            "python/shardwise/zero/config.py load (named when false)"
        ),
        "deepspeed:zero_optimization.allgather_partitions": (
            "python/shardwise/zero/config.py load (named when false)"
        ),
    }
)

# Named in a warning by the code that accepts them (the test that sees the warning after it).
NO_OPS.update(
    {
        **{
            f"fsdp:{key}": "python/shardwise/fsdp/module.py _check_launch_keys "
            f"({FC}fsdp_wrap_checks_the_launch_keys_against_the_group)"
            for key in ("local_rank", "master_addr", "master_port")
        },
        **{
            f"accelerate:{key}": "python/shardwise/fsdp/config.py _warn_accelerate_choices "
            f"({FT}test_accelerate_choices_with_no_counterpart_are_named)"
            for key in ("fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading", "fsdp_version")
        },
        **{
            f"deepspeed:optimizer.params.{key}": "python/shardwise/zero/config.py _optimizer "
            f"({TDS}test_adams_kernel_choices_are_named_with_what_runs)"
            for key in ("torch_adam", "fused", "foreach")
        },
    }
)

_PARSED = "only parsing is tested: "
_ENGINE = "the engine argument's effect is tested ("
_NO_KEY = ") but no test sets this key"
_ROUND = "only its resolution into the config is tested: "
_GPU_ONLY = "runs on a GPU only, not yet run there: tests/gpu/test_offload_cuda.py::"

GAPS: dict[str, str] = {
    # ---- shardwise-train
    "train:data.corpus": "one allowed value (pydoc), nothing to switch; no test",
    "train:distributed.local_rank": f"{_BY_HAND} sets it, but on CPU nothing reads it "
    "(it picks the GPU); no GPU test sets it",
    "train:distributed.pipeline.split": "runs with split=time only check they train and match "
    "(as split=parameters would); no test observes the cut",
    # ---- offload (FSDP, Accelerate, DeepSpeed) moves memory only off a GPU: on a CPU-only
    # machine every tensor is in CPU memory already; their tests are written and wait for a
    # GPU session (make test-gpu)
    **{
        key: _GPU_ONLY + "test_fsdp_offload_keys_keep_the_shards_in_cpu_memory"
        for key in ("fsdp:fsdp_cpu_offload", "accelerate:fsdp_offload_params")
    },
    **{
        f"deepspeed:zero_optimization.{key}": _GPU_ONLY
        + "test_zero_offload_keys_keep_the_state_in_cpu_memory"
        for key in (
            "cpu_offload",
            "cpu_offload_param",
            "cpu_offload_params",
            "offload_optimizer.device",
            "offload_optimizer.pin_memory",
            "offload_param.device",
            "offload_param.pin_memory",
        )
    },
}
