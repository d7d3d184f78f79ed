// Trains the bundled GPT from C++ (no Python in the step) on a text file's bytes, with FSDP
// (default) or ZeRO-1/2 (--strategy zero2), or as a pipeline (--pp 2: 1F1B over the ranks of each
// pipeline, the pipelines data parallel; --micro-batch rows per pipeline, cut into
// --microbatches), or tensor parallel (--tp 2: Megatron's split of attention heads, MLP and
// vocabulary over each group of --tp ranks, the groups data parallel):
//
//   torchrun --no-python --standalone --nproc_per_node=2 ./train_gpt --data corpus.txt
//
// Without torchrun it runs as one process. Rank 0 prints "step N loss L tokens/s T" every
// --log-every steps (the loss averaged over ranks) and a final "summary" line with the mean
// tokens/s (from the median step time of the slowest rank, the first step left out) and the
// largest peak RSS of any rank.
#include <shardwise/shardwise.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpointing.h"
#include "gpt.h"
#include "gpt_pipeline.h"
#include "gpt_tensor_parallel.h"

namespace {

struct Flags {
  std::string data;
  int64_t steps = 100, micro_batch = 8, seq_len = 128, dim = 192, layers = 4, heads = 6;
  int64_t seed = 0, log_every = 10, threads = 0, pp = 1, microbatches = 4, tp = 1;
  int64_t warmup_steps = 0, save_every = 50, keep_last = 3;
  std::string checkpoint_dir;  // resumable checkpoints (shardwise-train's format); empty: none
  double lr = 1e-3, clip = 1.0;
  std::string dtype = "fp32";
  std::string strategy = "fsdp";
  bool strategy_given = false;
  std::string schedule = "1f1b";
  std::string save;  // a safetensors path for the trained model; empty: none
};

const char* kUsage =
    "usage: train_gpt --data FILE [--steps N] [--micro-batch N] [--seq-len N] [--dim N]\n"
    "                 [--layers N] [--heads N] [--lr X] [--clip X (0: off)] [--seed N]\n"
    "                 [--dtype fp32|bf16] [--strategy fsdp|zero1|zero2] [--log-every N]\n"
    "                 [--threads N] [--save MODEL.safetensors]\n"
    "                 [--pp STAGES [--microbatches N] [--schedule 1f1b|gpipe]] [--tp N]\n"
    "                 [--warmup-steps N] [--checkpoint-dir DIR [--save-every N] [--keep-last N]]\n";

// `value` of `flag` as a number; an error naming both when it is not one.
double number(const std::string& flag, const std::string& value, bool integer) {
  size_t used = 0;
  double parsed = 0;
  try {
    parsed = integer ? static_cast<double>(std::stoll(value, &used)) : std::stod(value, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw std::invalid_argument(flag + " " + value + ": not a number\n" + kUsage);
  }
  return parsed;
}

Flags parse(int argc, char** argv) {
  Flags f;
  std::map<std::string, int64_t*> ints{{"--steps", &f.steps},
                                       {"--micro-batch", &f.micro_batch},
                                       {"--seq-len", &f.seq_len},
                                       {"--dim", &f.dim},
                                       {"--layers", &f.layers},
                                       {"--heads", &f.heads},
                                       {"--seed", &f.seed},
                                       {"--log-every", &f.log_every},
                                       {"--threads", &f.threads},
                                       {"--pp", &f.pp},
                                       {"--microbatches", &f.microbatches},
                                       {"--tp", &f.tp},
                                       {"--warmup-steps", &f.warmup_steps},
                                       {"--save-every", &f.save_every},
                                       {"--keep-last", &f.keep_last}};
  std::map<std::string, double*> reals{{"--lr", &f.lr}, {"--clip", &f.clip}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    const bool text = flag == "--data" || flag == "--dtype" || flag == "--strategy" ||
                      flag == "--save" || flag == "--schedule" || flag == "--checkpoint-dir";
    if (!text && !ints.count(flag) && !reals.count(flag)) {
      throw std::invalid_argument("unknown flag " + flag + "\n" + kUsage);
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    if (flag == "--data") {
      f.data = value;
    } else if (flag == "--dtype") {
      f.dtype = value;
    } else if (flag == "--strategy") {
      f.strategy = value;
      f.strategy_given = true;
    } else if (flag == "--schedule") {
      f.schedule = value;
    } else if (flag == "--checkpoint-dir") {
      f.checkpoint_dir = value;
    } else if (flag == "--save") {
      f.save = value;
    } else if (ints.count(flag)) {
      *ints[flag] = static_cast<int64_t>(number(flag, value, /*integer=*/true));
    } else {
      *reals[flag] = number(flag, value, /*integer=*/false);
    }
  }
  if (f.data.empty()) throw std::invalid_argument(std::string("--data is required\n") + kUsage);
  for (const auto& [flag, value] : ints) {
    if (*value < (flag == "--seed" || flag == "--threads" || flag == "--warmup-steps" ? 0 : 1)) {
      throw std::invalid_argument(flag + " must be positive");
    }
  }
  if (f.dim % f.heads != 0) throw std::invalid_argument("--dim must be a multiple of --heads");
  if (f.dtype != "fp32" && f.dtype != "bf16") {
    throw std::invalid_argument("--dtype " + f.dtype + ": use fp32 or bf16");
  }
  if (f.strategy != "fsdp" && f.strategy != "zero1" && f.strategy != "zero2") {
    throw std::invalid_argument("--strategy " + f.strategy + ": use fsdp, zero1 or zero2");
  }
  if (f.strategy != "fsdp" && f.dtype != "fp32") {
    throw std::invalid_argument("--dtype " + f.dtype + " needs --strategy fsdp (ZeRO runs fp32)");
  }
  if (!f.checkpoint_dir.empty() && (f.pp > 1 || f.tp > 1)) {
    throw std::invalid_argument(
        "--checkpoint-dir: resumable checkpoints are written for --strategy fsdp, zero1 and "
        "zero2 so far; drop --pp and --tp");
  }
  if (f.warmup_steps > f.steps) {
    throw std::invalid_argument("--warmup-steps " + std::to_string(f.warmup_steps) +
                                " exceeds --steps " + std::to_string(f.steps));
  }
  if (f.schedule != "1f1b" && f.schedule != "gpipe") {
    throw std::invalid_argument("--schedule " + f.schedule + ": use 1f1b or gpipe");
  }
  if (f.pp > 1 && f.tp > 1) {
    throw std::invalid_argument("--pp with --tp: not combined in this example; use one of them");
  }
  if ((f.pp > 1 || f.tp > 1) && f.strategy_given) {
    throw std::invalid_argument("--strategy " + f.strategy +
                                " with --pp or --tp: their groups "
                                "are data parallel with replicated weights; leave --strategy out "
                                "(it applies without --pp and --tp)");
  }
  if ((f.pp > 1 || f.tp > 1) && f.dtype != "fp32") {
    throw std::invalid_argument("--pp and --tp run fp32; leave --dtype out");
  }
  if (f.tp > 1) {
    for (const auto& [what, value] : std::map<std::string, int64_t>{
             {"--heads", f.heads}, {"--dim", f.dim}, {"the vocabulary size", 256}}) {
      if (value % f.tp != 0) {
        throw std::invalid_argument("--tp " + std::to_string(f.tp) + " must divide " + what + " (" +
                                    std::to_string(value) + ")");
      }
    }
  }
  if (f.pp > 1) {
    if (f.micro_batch % f.microbatches != 0) {
      throw std::invalid_argument("--micro-batch " + std::to_string(f.micro_batch) +
                                  " must be a multiple of --microbatches " +
                                  std::to_string(f.microbatches));
    }
    if (f.pp > f.layers + 2) {
      throw std::invalid_argument("--pp " + std::to_string(f.pp) + ": at most --layers + 2 (" +
                                  std::to_string(f.layers + 2) + ") stages");
    }
  }
  return f;
}

// The mean cross-entropy of the logits against the next tokens.
torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat).reshape({-1, logits.size(-1)}), targets.reshape(-1));
}

// The model under one strategy: a whole training step (forward, backward, clip, optimizer step,
// zero_grad) returning this rank's loss (undefined on ranks that compute none: a pipeline's
// earlier stages), the full parameters by name (collective; complete on rank 0), and which part
// of the data this rank reads.
struct Strategy {
  std::function<torch::Tensor(const torch::Tensor& inputs, const torch::Tensor& targets)> step;
  std::function<torch::OrderedDict<std::string, torch::Tensor>()> full_state;
  int data_rank = 0, data_world = 1;
  std::function<void(double)> set_lr;
  CheckpointHooks checkpoint;  // empty: this strategy does not checkpoint yet
};

// Every parameter group's learning rate.
std::function<void(double)> lr_setter(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  return [optimizer](double lr) {
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
  };
}

// shardwise-train's schedule: linear warm-up to the peak, then cosine decay to 10% of it at the
// last step.
double lr_at(int64_t step, const Flags& flags) {
  if (flags.warmup_steps > 0 && step <= flags.warmup_steps) {
    return flags.lr * static_cast<double>(step) / static_cast<double>(flags.warmup_steps);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, flags.steps - flags.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - flags.warmup_steps) / span);
  return flags.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress)));
}

// The (dp, inner) mesh of `inner` consecutive ranks (the pipeline or tensor-parallel groups) and
// the world / inner data-parallel groups across them; every replica starts from rank 0's weights.
std::shared_ptr<shardwise::distributed::DeviceMesh> data_parallel_mesh(
    GPT model, int inner, const std::string& axis, const shardwise::distributed::World& world) {
  if (world.size() % inner != 0) {
    throw std::invalid_argument("--" + axis + " " + std::to_string(inner) +
                                " must divide the world size " + std::to_string(world.size()));
  }
  shardwise::distributed::broadcast_module(*model, *world.group);
  return std::make_shared<shardwise::distributed::DeviceMesh>(
      world, std::vector<int>{world.size() / inner, inner}, std::vector<std::string>{"dp", axis});
}

// The fused AdamW every strategy but ZeRO uses (shardwise-train's betas and weight decay).
std::shared_ptr<shardwise::optim::FusedAdamW> fused_adamw(std::vector<torch::Tensor> params,
                                                          const Flags& flags) {
  return std::make_shared<shardwise::optim::FusedAdamW>(
      std::move(params), torch::optim::AdamWOptions(flags.lr).betas({0.9, 0.95}).weight_decay(0.1));
}

// FSDP: every block its own unit, the embeddings and final norm the root; the fused AdamW steps
// the fp32 shards.
Strategy fsdp(GPT model, const Flags& flags, const shardwise::distributed::World& world) {
  shardwise::fsdp::FullyShardOptions options;
  options.shard_group = world.group;
  if (flags.dtype == "bf16") options.param_dtype = at::kBFloat16;
  options.reduce_dtype = at::kFloat;
  auto wrapper = std::make_shared<shardwise::fsdp::FullyShardedDataParallel<GPT>>(
      model, options, std::vector<torch::nn::Sequential*>{&model->blocks});
  auto optimizer = fused_adamw(wrapper->parameters(), flags);
  const double clip = flags.clip;
  Strategy out{
      [wrapper, optimizer, clip](const torch::Tensor& inputs, const torch::Tensor& targets) {
        auto loss = gpt_loss(wrapper->forward(inputs), targets);
        loss.backward();
        if (clip > 0) wrapper->clip_grad_norm_(clip);
        optimizer->step();
        optimizer->zero_grad();
        return loss.detach();
      },
      [wrapper] { return wrapper->full_state_dict(); }, world.rank(), world.size(),
      lr_setter(optimizer)};
  out.checkpoint = fsdp_checkpoint(wrapper, optimizer);
  return out;
}

// ZeRO-1/2: the model whole on every rank (rank 0's weights), the optimizer state (and with
// stage 2 the gradients) partitioned.
Strategy zero(GPT model, const Flags& flags, const shardwise::distributed::World& world) {
  shardwise::distributed::broadcast_module(*model, *world.group);
  shardwise::zero::ZeroOptions options;
  options.stage = flags.strategy == "zero1" ? 1 : 2;
  options.group = world.group;
  options.gradient_clipping = flags.clip;
  options.optimizer.lr = flags.lr;
  options.optimizer.beta2 = 0.95;
  options.optimizer.weight_decay = 0.1;
  auto optimizer =
      std::make_shared<shardwise::zero::ZeroRedundancyOptimizer>(model->parameters(), options);
  return {[model, optimizer](const torch::Tensor& inputs, const torch::Tensor& targets) mutable {
            auto loss = gpt_loss(model->forward(inputs), targets);
            loss.backward();
            optimizer->step();
            optimizer->zero_grad();
            return loss.detach();
          },
          [model] { return model->named_parameters(); },
          world.rank(),
          world.size(),
          lr_setter(optimizer),
          zero_checkpoint(optimizer)};
}

// A pipeline of --pp stages (split_by_parameters over gpt_blocks), one per rank of each
// pipeline; the world / --pp pipelines are data parallel (their replicated stages' gradients
// averaged by the Pipeline). The token embedding on the first stage and the head's copy on the
// last are tied. The fused AdamW steps this rank's stage; clipping uses the pipeline's norm.
Strategy pipelined(GPT model, const Flags& flags, const shardwise::distributed::World& world) {
  const int pp = static_cast<int>(flags.pp);
  auto mesh = data_parallel_mesh(model, pp, "pp", world);
  const int dp = mesh->size("dp");
  const int stage = mesh->coordinate("pp");
  const torch::Tensor head = model->embed->weight.detach().clone().requires_grad_(true);
  const std::vector<GPTBlock> blocks = gpt_blocks(model, head);
  std::vector<std::vector<torch::Tensor>> block_parameters;
  for (const auto& b : blocks) {
    block_parameters.emplace_back();
    for (const auto& [name, p] : b.parameters) block_parameters.back().push_back(p);
  }
  const auto groups = shardwise::pipeline::stage_groups(
      shardwise::pipeline::split_by_parameters(block_parameters, pp),
      static_cast<int>(blocks.size()));
  shardwise::pipeline::PipelineOptions options;
  options.schedule = shardwise::pipeline::make_schedule(
      {flags.schedule == "gpipe" ? shardwise::pipeline::ScheduleKind::kGPipe
                                 : shardwise::pipeline::ScheduleKind::k1F1B,
       pp, static_cast<int>(flags.microbatches), 1});
  options.rank = stage;
  options.group = mesh->group({"pp"});
  if (dp > 1) options.data_parallel_group = mesh->group({"dp"});
  options.tied = {{0, "embed.weight", pp - 1, "head.weight"}};
  options.loss = gpt_loss;
  auto pipeline = std::make_shared<shardwise::pipeline::Pipeline>(
      std::vector<shardwise::pipeline::PipelineStage>{gpt_stage(blocks, groups[stage], stage)},
      options);
  auto optimizer = fused_adamw(pipeline->parameters(), flags);
  const double clip = flags.clip;
  auto step = [pipeline, optimizer, clip, stage, pp](const torch::Tensor& inputs,
                                                     const torch::Tensor& targets) {
    const auto result = pipeline->step(inputs, targets);
    if (clip > 0) pipeline->clip_grad_norm_(clip);
    optimizer->step();
    optimizer->zero_grad();
    return stage == pp - 1 ? torch::tensor(result.loss, torch::kFloat64) : torch::Tensor();
  };
  // The first pipeline's stages send their parameters to rank 0 (stage 0 of that pipeline).
  auto full_state = [mesh, blocks, groups, stage, pp, group = options.group] {
    torch::OrderedDict<std::string, torch::Tensor> full;
    if (mesh->coordinate("dp") != 0) return full;
    for (int s = 0; s < pp; ++s) {
      for (int i : groups[s]) {
        for (const auto& [name, p] : blocks[i].parameters) {
          if (name == "head.weight") continue;  // the tie's copy (saved as embed.weight's)
          std::vector<torch::Tensor> tensor{s == stage ? p.detach().contiguous()
                                                       : torch::empty_like(p)};
          if (s != stage && stage == 0) group->recv(tensor, s, 0)->wait();
          if (s == stage && stage != 0) group->send(tensor, 0, 0)->wait();
          if (stage == 0) full.insert(name, tensor[0].clone());
        }
      }
    }
    return full;
  };
  return {step, full_state, mesh->coordinate("dp"), dp, lr_setter(optimizer)};
}

// Tensor parallelism over groups of --tp consecutive ranks, the world / --tp groups data
// parallel (gradients averaged over them); clipping takes the whole model's norm (split
// gradients summed over the tp group, replicated ones counted once).
Strategy tensor_parallel(GPT model,
                         const Flags& flags,
                         const shardwise::distributed::World& world) {
  auto mesh = data_parallel_mesh(model, static_cast<int>(flags.tp), "tp", world);
  const int dp = mesh->size("dp");
  auto tp_group = mesh->group({"tp"});
  auto dp_group = dp > 1 ? mesh->group({"dp"}) : nullptr;
  auto sharded = std::make_shared<TensorParallelGPT>(model, tp_group);
  auto optimizer = fused_adamw(sharded->parameters(), flags);
  const double clip = flags.clip;
  auto step = [sharded, optimizer, clip, tp_group, dp_group](const torch::Tensor& inputs,
                                                             const torch::Tensor& targets) {
    auto loss = sharded->loss(sharded->forward(inputs), targets);
    loss.backward();
    if (dp_group) shardwise::distributed::average_gradients(sharded->parameters(), *dp_group);
    if (clip > 0) {
      const auto [split, replicated] = sharded->split_and_replicated_grads();
      shardwise::tensor_parallel::ClipOptions options;
      options.max_norm = clip;
      options.tp_group = tp_group;
      shardwise::tensor_parallel::clip_grad_norm_(split, replicated, options);
    }
    optimizer->step();
    optimizer->zero_grad();
    return loss.detach();
  };
  return {step, [sharded] { return sharded->full_state(); }, mesh->coordinate("dp"), dp,
          lr_setter(optimizer)};
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

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The largest `value` of any rank.
double max_over_ranks(c10d::ProcessGroup& group, double value) {
  std::vector<at::Tensor> tensors{torch::tensor({value}, torch::kFloat64)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group.allreduce(tensors, options)->wait();
  return tensors[0].item<double>();
}

// The mean of `loss` over the ranks where it is defined (all, or a pipeline's last stages).
double mean_over_ranks_with_a_loss(c10d::ProcessGroup& group, const torch::Tensor& loss) {
  std::vector<at::Tensor> tensors{torch::tensor(
      {loss.defined() ? loss.item<double>() : 0.0, loss.defined() ? 1.0 : 0.0}, torch::kFloat64)};
  group.allreduce(tensors)->wait();
  return tensors[0][0].item<double>() / tensors[0][1].item<double>();
}

// The median over steps (the first, warm-up step left out when there are others) of each step's
// slowest rank: shardwise-train's step_s.
double median_step_seconds(c10d::ProcessGroup& group, const std::vector<double>& seconds) {
  std::vector<at::Tensor> tensors{torch::tensor(seconds, torch::kFloat64)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group.allreduce(tensors, options)->wait();
  at::Tensor slowest = tensors[0];
  if (slowest.numel() > 1) slowest = slowest.slice(0, 1);
  return slowest.median().item<double>();
}

int run(const Flags& flags) {
  if (flags.threads > 0) torch::set_num_threads(static_cast<int>(flags.threads));
  auto world = shardwise::distributed::init_from_env_or_single();
  auto& group = *world.group;

  // Every rank builds the same model from the same seed (and rank 0's weights are broadcast).
  torch::manual_seed(static_cast<uint64_t>(flags.seed));
  GPTConfig cfg;
  cfg.seq_len = flags.seq_len;
  cfg.dim = flags.dim;
  cfg.layers = flags.layers;
  cfg.heads = flags.heads;
  GPT model(cfg);
  Strategy strategy = flags.pp > 1               ? pipelined(model, flags, world)
                      : flags.tp > 1             ? tensor_parallel(model, flags, world)
                      : flags.strategy == "fsdp" ? fsdp(model, flags, world)
                                                 : zero(model, flags, world);

  auto [train, validation] =
      shardwise::data::split_tokens(shardwise::data::read_byte_tokens(flags.data));
  shardwise::data::TokenStreamOptions stream_options;
  stream_options.seq_len = flags.seq_len;
  stream_options.micro_batch = flags.micro_batch;
  stream_options.data_rank = strategy.data_rank;
  stream_options.data_world = strategy.data_world;
  stream_options.seed = flags.seed;
  shardwise::data::TokenStream stream(train, stream_options);

  const double tokens_per_step =
      static_cast<double>(flags.micro_batch * flags.seq_len) * strategy.data_world;
  std::vector<double> step_seconds;
  auto interval_start = std::chrono::steady_clock::now();
  int64_t first_step = 1;
  if (!flags.checkpoint_dir.empty()) {
    first_step += resume_from(flags.checkpoint_dir, strategy.checkpoint, stream, world);
  }
  for (int64_t step = first_step; step <= flags.steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    auto [inputs, targets] = stream.next();
    strategy.set_lr(lr_at(step, flags));
    const torch::Tensor loss = strategy.step(inputs, targets);
    const auto now = std::chrono::steady_clock::now();
    step_seconds.push_back(std::chrono::duration<double>(now - step_start).count());
    if (step % flags.log_every == 0 || step == flags.steps) {
      const double mean_loss = mean_over_ranks_with_a_loss(group, loss);
      const int64_t steps_in_interval =
          step % flags.log_every == 0 ? flags.log_every : step % flags.log_every;
      const double seconds = std::chrono::duration<double>(now - interval_start).count();
      if (world.rank() == 0) {
        std::printf("step %lld loss %.7f tokens/s %.1f\n", static_cast<long long>(step), mean_loss,
                    tokens_per_step * steps_in_interval / seconds);
        std::fflush(stdout);
      }
      interval_start = std::chrono::steady_clock::now();
    }
    if (!flags.checkpoint_dir.empty() && (step % flags.save_every == 0 || step == flags.steps)) {
      save_to(flags.checkpoint_dir, step, static_cast<int>(flags.keep_last), config_text(flags),
              strategy.checkpoint, stream, world);
    }
  }
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
  const double rss = max_over_ranks(group, peak_rss_mib());
  const double step_s = median_step_seconds(group, step_seconds);
  if (world.rank() == 0) {
    std::printf("summary world %d tokens/s %.1f step_s %.5f peak_rss_mib %.1f\n", world.size(),
                tokens_per_step / step_s, step_s, rss);
  }
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
