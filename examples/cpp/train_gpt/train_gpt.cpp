// Trains the bundled GPT from C++ (no Python in the step) on a text file's bytes, with FSDP
// (default) or ZeRO-1/2 (--strategy zero2):
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

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpt.h"

namespace {

struct Flags {
  std::string data;
  int64_t steps = 100, micro_batch = 8, seq_len = 128, dim = 192, layers = 4, heads = 6;
  int64_t seed = 0, log_every = 10, threads = 0;
  double lr = 1e-3, clip = 1.0;
  std::string dtype = "fp32";
  std::string strategy = "fsdp";
  std::string save;  // a safetensors path for the trained model; empty: none
};

const char* kUsage =
    "usage: train_gpt --data FILE [--steps N] [--micro-batch N] [--seq-len N] [--dim N]\n"
    "                 [--layers N] [--heads N] [--lr X] [--clip X (0: off)] [--seed N]\n"
    "                 [--dtype fp32|bf16] [--strategy fsdp|zero1|zero2] [--log-every N]\n"
    "                 [--threads N] [--save MODEL.safetensors]\n";

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
  std::map<std::string, int64_t*> ints{
      {"--steps", &f.steps}, {"--micro-batch", &f.micro_batch}, {"--seq-len", &f.seq_len},
      {"--dim", &f.dim},     {"--layers", &f.layers},           {"--heads", &f.heads},
      {"--seed", &f.seed},   {"--log-every", &f.log_every},     {"--threads", &f.threads}};
  std::map<std::string, double*> reals{{"--lr", &f.lr}, {"--clip", &f.clip}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    const bool text =
        flag == "--data" || flag == "--dtype" || flag == "--strategy" || flag == "--save";
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
    if (*value < (flag == "--seed" || flag == "--threads" ? 0 : 1)) {
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
  return f;
}

// The model under one strategy: forward, then clip + optimizer step + zero_grad, and the full
// parameters by name (collective).
struct Strategy {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void()> update;
  std::function<torch::OrderedDict<std::string, torch::Tensor>()> full_state;
};

// FSDP: every block its own unit, the embeddings and final norm the root; the fused AdamW steps
// the fp32 shards.
Strategy fsdp(GPT model, const Flags& flags, const shardwise::distributed::World& world) {
  shardwise::fsdp::FullyShardOptions options;
  options.shard_group = world.group;
  if (flags.dtype == "bf16") options.param_dtype = at::kBFloat16;
  options.reduce_dtype = at::kFloat;
  auto wrapper = std::make_shared<shardwise::fsdp::FullyShardedDataParallel<GPT>>(
      model, options, std::vector<torch::nn::Sequential*>{&model->blocks});
  auto optimizer = std::make_shared<shardwise::optim::FusedAdamW>(
      wrapper->parameters(),
      torch::optim::AdamWOptions(flags.lr).betas({0.9, 0.95}).weight_decay(0.1));
  const double clip = flags.clip;
  return {[wrapper](const torch::Tensor& x) { return wrapper->forward(x); },
          [wrapper, optimizer, clip] {
            if (clip > 0) wrapper->clip_grad_norm_(clip);
            optimizer->step();
            optimizer->zero_grad();
          },
          [wrapper] { return wrapper->full_state_dict(); }};
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
  return {[model](const torch::Tensor& x) mutable { return model->forward(x); },
          [optimizer] {
            optimizer->step();
            optimizer->zero_grad();
          },
          [model] { return model->named_parameters(); }};
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The mean over ranks (op SUM, then divided) or the maximum (op MAX) of `value`.
double reduce(c10d::ProcessGroup& group, double value, c10d::ReduceOp::RedOpType op) {
  std::vector<at::Tensor> tensors{torch::tensor({value}, torch::kFloat64)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.allreduce(tensors, options)->wait();
  const double out = tensors[0].item<double>();
  return op == c10d::ReduceOp::SUM ? out / group.getSize() : out;
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
  Strategy strategy =
      flags.strategy == "fsdp" ? fsdp(model, flags, world) : zero(model, flags, world);

  auto [train, validation] =
      shardwise::data::split_tokens(shardwise::data::read_byte_tokens(flags.data));
  shardwise::data::TokenStreamOptions stream_options;
  stream_options.seq_len = flags.seq_len;
  stream_options.micro_batch = flags.micro_batch;
  stream_options.data_rank = world.rank();
  stream_options.data_world = world.size();
  stream_options.seed = flags.seed;
  shardwise::data::TokenStream stream(train, stream_options);

  const double tokens_per_step =
      static_cast<double>(flags.micro_batch * flags.seq_len) * world.size();
  std::vector<double> step_seconds;
  auto interval_start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= flags.steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    auto [inputs, targets] = stream.next();
    auto logits = strategy.forward(inputs);
    auto loss = torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat).reshape({-1, cfg.vocab_size}), targets.reshape(-1));
    loss.backward();
    strategy.update();
    const auto now = std::chrono::steady_clock::now();
    step_seconds.push_back(std::chrono::duration<double>(now - step_start).count());
    if (step % flags.log_every == 0 || step == flags.steps) {
      const double mean_loss = reduce(group, loss.item<double>(), c10d::ReduceOp::SUM);
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
  }
  if (!flags.save.empty()) {
    auto full = strategy.full_state();  // every rank takes part in the gather
    // The head is the token embedding; written under both names, as shardwise-train does, so
    // the Python GPT loads the file with strict=True.
    full.insert("head.weight", full["embed.weight"]);
    if (world.rank() == 0) {
      shardwise::checkpoint::save_safetensors(flags.save, full, {{"format", "pt"}});
      std::printf("saved %zu tensors to %s\n", full.size(), flags.save.c_str());
    }
  }
  const double rss = reduce(group, peak_rss_mib(), c10d::ReduceOp::MAX);
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
