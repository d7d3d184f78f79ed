// Trains the bundled GPT from C++ (no Python in the step) on a text file's bytes, with FSDP
// (default) or ZeRO-1/2 (--strategy zero2), or as a pipeline (--pp 2: 1F1B over the ranks of each
// pipeline, the pipelines data parallel; --micro-batch rows per pipeline, cut into
// --microbatches), or tensor parallel (--tp 2: Megatron's split of attention heads, MLP and
// vocabulary over each group of --tp ranks, the groups data parallel), or both (--pp 2 --tp 2:
// each stage tensor parallel, 4 ranks per pipeline):
//
//   torchrun --no-python --standalone --nproc_per_node=2 ./train_gpt --data corpus.txt
//
// --accumulation N: each step reads N micro-batches per data rank. --deterministic: the same bits
// (weights, logged losses) at every data-parallel size and pipeline size for a fixed global batch
// (--micro-batch x --accumulation x data ranks; with --pp, --micro-batch is cut into
// --microbatches): contiguous micro-batches, the engines' tree reductions, one intra-op thread.
//
// Without torchrun it runs as one process. Rank 0 prints "step N loss L tokens/s T" every
// --log-every steps (the loss averaged over ranks) and a final "summary" line with the mean
// tokens/s (from the median step time of the slowest rank, the first step left out) and the
// largest peak RSS of any rank.
#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "flags.h"
#include "gpt.h"
#include "pipeline_strategy.h"
#include "strategies.h"

namespace {

// Prints `line` on rank 0.
void print(const shardwise::distributed::World& world, const std::string& line) {
  if (world.rank() == 0 && !line.empty()) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// The run's settings, recorded in each checkpoint's manifest.
std::string config_text(const Flags& f) {
  return "# train_gpt\nmodel: {dim: " + std::to_string(f.dim) +
         ", layers: " + std::to_string(f.layers) + ", heads: " + std::to_string(f.heads) +
         ", seq_len: " + std::to_string(f.seq_len) +
         "}\ntraining: {micro_batch_size: " + std::to_string(f.micro_batch) +
         ", max_steps: " + std::to_string(f.steps) + ", learning_rate: " + std::to_string(f.lr) +
         ", warmup_steps: " + std::to_string(f.warmup_steps) + ", seed: " + std::to_string(f.seed) +
         "}\n";
}

// The step's loss for the log: the mean of this rank's micro-batch losses (undefined where none).
// Deterministic: every data rank's micro-batch losses added left to right in the global order
// m = (j * W + r) * c + k (accumulation step j, data rank r, pipeline microbatch k), returned on
// data rank 0 only, so the logged value does not depend on W.
torch::Tensor step_loss(const std::vector<torch::Tensor>& losses,
                        const Strategy& strategy,
                        bool deterministic) {
  if (losses.empty() || !losses[0].defined()) return {};
  const torch::Tensor mine = torch::stack(losses);  // [accumulation, microbatches]
  if (!deterministic) return mine.mean();
  std::vector<torch::Tensor> every{mine};
  if (strategy.data_group) {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < strategy.data_world; ++r) out[0].push_back(torch::empty_like(mine));
    std::vector<at::Tensor> in{mine};
    strategy.data_group->allgather(out, in)->wait();
    every = out[0];
  }
  double sum = 0;
  for (int64_t j = 0; j < mine.size(0); ++j) {
    for (const torch::Tensor& rank : every) {
      const auto row = rank.accessor<double, 2>()[j];
      for (int64_t k = 0; k < mine.size(1); ++k) sum += row[k];
    }
  }
  if (strategy.data_rank != 0) return {};
  return torch::tensor(sum / static_cast<double>(mine.numel() * every.size()), torch::kFloat64);
}

// Loads the newest checkpoint under --checkpoint-dir; the steps already done (0: none).
int64_t resume(const Flags& flags,
               const Strategy& strategy,
               shardwise::data::TokenStream& stream,
               const shardwise::distributed::World& world) {
  const auto resumed = shardwise::training::resume_training(flags.checkpoint_dir,
                                                            strategy.checkpoint, stream, world);
  for (const auto& line : resumed.report()) print(world, line);
  return resumed.step;
}

int run(const Flags& flags) {
  if (flags.threads > 0) torch::set_num_threads(static_cast<int>(flags.threads));
  if (flags.deterministic) {  // a BLAS may split a reduction over its threads
    torch::set_num_threads(1);
    at::globalContext().setDeterministicAlgorithms(true, false);
  }
  auto world = shardwise::distributed::init_from_env_or_single();
  namespace training = shardwise::training;
  const auto& group = world.group;

  // Every rank builds the same model from the same seed (and rank 0's weights are broadcast).
  torch::manual_seed(static_cast<uint64_t>(flags.seed));
  GPT model(GPTConfig{
      .seq_len = flags.seq_len, .dim = flags.dim, .layers = flags.layers, .heads = flags.heads});
  Strategy strategy = flags.pp > 1               ? pipelined(model, flags, world)
                      : flags.tp > 1             ? tensor_parallel(model, flags, world)
                      : flags.strategy == "fsdp" ? fsdp(model, flags, world)
                                                 : zero(model, flags, world);

  if (!strategy.mesh.empty()) print(world, "mesh: " + strategy.mesh);

  auto [train, validation] =
      shardwise::data::split_tokens(shardwise::data::read_byte_tokens(flags.data));
  shardwise::data::TokenStream stream(
      train, {.seq_len = flags.seq_len,
              .micro_batch = flags.micro_batch,
              .data_rank = strategy.data_rank,
              .data_world = strategy.data_world,
              .seed = flags.seed,
              .contiguous = flags.deterministic,
              .batches_per_step = flags.deterministic ? flags.accumulation : 1});

  int64_t first_step = 1;
  if (!flags.checkpoint_dir.empty()) first_step += resume(flags, strategy, stream, world);
  training::WarmupCosineOptions schedule{flags.lr, flags.warmup_steps, flags.steps};
  training::RunCheckpointOptions saving{flags.checkpoint_dir, static_cast<int>(flags.keep_last),
                                        config_text(flags)};
  std::optional<training::AsyncRunCheckpoints> saver;  // --checkpoint-mode async
  if (!flags.checkpoint_dir.empty() && flags.checkpoint_mode == "async") {
    saver.emplace(world, saving);
  }
  training::StepLog log(
      group, {flags.log_every, flags.steps,
              static_cast<double>(flags.micro_batch * flags.seq_len * flags.accumulation) *
                  strategy.data_world});
  // each micro-batch's loss over the global count (deterministic) or the local one (a mean)
  const double divisor =
      static_cast<double>(flags.accumulation) * (flags.deterministic ? strategy.data_world : 1);
  for (int64_t step = first_step; step <= flags.steps; ++step) {
    log.begin();
    std::vector<Strategy::Batch> batches;
    for (int64_t j = 0; j < flags.accumulation; ++j) batches.push_back(stream.next());
    const double lr = training::warmup_cosine_lr(schedule, step);
    const auto losses = strategy.step(batches, divisor, lr, flags.clip);
    print(world, log.end(step, step_loss(losses, strategy, flags.deterministic)));
    if (!flags.checkpoint_dir.empty() && (step % flags.save_every == 0 || step == flags.steps)) {
      if (saver) {
        saver->save(step, strategy.checkpoint, stream);
      } else {
        training::save_training_step(step, strategy.checkpoint, stream, world, saving);
      }
    }
  }
  if (saver) saver->wait();  // the last save complete before the run ends
  if (!flags.save.empty()) {
    auto full = strategy.full_state();  // every rank takes part in the gather
    if (world.rank() == 0) {
      // The head is the token embedding; written under both names, as shardwise-train does, so
      // the Python GPT loads the file with strict=True.
      full.insert("head.weight", full["embed.weight"]);
      shardwise::checkpoint::save_safetensors(flags.save, full, {{"format", "pt"}});
      std::printf("saved %zu tensors to %s\n", full.size(), flags.save.c_str());
    }
  }
  print(world, log.summary());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "train_gpt: " << e.what() << "\n";
    return 2;
  }
}
