// shardwise's C++ API in one include: #include <shardwise/shardwise.h>, link shardwise::shardwise.
//
//   distributed::init_from_env, new_group, DeviceMesh   process groups without Python (torchrun)
//   backend::ShardwiseBackend                          the c10d backend itself
//   fsdp::FsdpEngine, fsdp::FsdpUnit                   fully sharded data parallelism
//   zero::ZeroRedundancyOptimizer                      ZeRO 0-2 as a torch::optim optimizer
//   zero::ZeroOptimizer, zero::GradScaler              the ZeRO engine and fp16 loss scaling
//   optim::FusedAdamW (and fused_optim_ops.h)          the fused AdamW as a torch::optim optimizer
//   pipeline::Pipeline, PipelineExecutor              pipeline parallelism (1F1B, ZB-H1, ...)
//   pipeline::split_by_time, split_by_parameters       cutting a model into stages
//   distributed::average_gradients                    data-parallel gradient averaging
//   tensor_parallel::*                                 column/row/vocab-parallel layers, attention
//   sharding::*                                        flat layouts and checkpoint pieces
//   checkpoint::save_safetensors                       full-model export (crash-safe)
//   checkpoint::save_training_checkpoint, load_latest_  resumable checkpoints shared with
//     training_checkpoint, optim::adamw_slots            shardwise-train
//   data::TokenStream                                  the trainers' data stream
//   training::*                                        the rules composing them (LR schedule,
//                                                      mesh clip, writer rule, full state,
//                                                      StageCut, run save/resume)
//   ops (precision/cast_ops.h)                         the bf16/fp16 casts
#pragma once

#define SHARDWISE_VERSION_MAJOR 0
#define SHARDWISE_VERSION_MINOR 1
#define SHARDWISE_VERSION_PATCH 0

#include "backend/shardwise_backend.hpp"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_checkpoint.h"
#include "data/token_file_tensor.h"
#include "data/token_stream.h"
#include "distributed/average_gradients.h"
#include "distributed/broadcast_module.h"
#include "distributed/device_mesh.h"
#include "distributed/process_group.h"
#include "distributed/torchrun_env.h"
#include "fsdp/fsdp_engine.h"
#include "fsdp/fsdp_unit.h"
#include "fsdp/fully_shard.h"
#include "mesh/mesh_layout.h"
#include "mesh/parallel_layout.h"
#include "optim/adamw_slots.h"
#include "optim/fused_adamw.h"
#include "optim/fused_optim_ops.h"
#include "pipeline/block_stages.h"
#include "pipeline/executor.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule.h"
#include "pipeline/split_by_time.h"
#include "precision/cast_ops.h"
#include "sharding/checkpoint_pieces.h"
#include "tensor_parallel/grad_norm.h"
#include "tensor_parallel/parallel_attention.h"
#include "tensor_parallel/parallel_linear.h"
#include "tensor_parallel/regions.h"
#include "tensor_parallel/shard_tensor.h"
#include "tensor_parallel/sharded_parameters.h"
#include "tensor_parallel/vocab_parallel.h"
#include "training/async_run_checkpoint.h"
#include "training/checkpoint_hooks.h"
#include "training/checkpoint_writer.h"
#include "training/full_state.h"
#include "training/lr_schedule.h"
#include "training/mesh_clip.h"
#include "training/run_checkpoint.h"
#include "training/run_stats.h"
#include "training/stage_cut.h"
#include "zero/grad_scaler.h"
#include "zero/zero_optimizer.h"
#include "zero/zero_redundancy_optimizer.h"
