// train_gpt's command line: the flags, their defaults and the checks that name a bad one before
// anything runs.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

struct Flags {
  std::string data;
  int64_t steps = 100, micro_batch = 8, seq_len = 128, dim = 192, layers = 4, heads = 6;
  int64_t seed = 0, log_every = 10, threads = 0, pp = 1, microbatches = 4, tp = 1;
  int64_t warmup_steps = 0, save_every = 50, keep_last = 3, accumulation = 1;
  bool deterministic = false;  // the same bits at every data-parallel (and pipeline) size
  std::string checkpoint_dir;  // resumable checkpoints (shardwise-train's format); empty: none
  std::string checkpoint_mode = "sync";  // async: written by a background thread
  double lr = 1e-3, clip = 1.0;
  std::string dtype = "fp32", strategy = "fsdp", schedule = "1f1b";
  bool strategy_given = false;
  std::string save;  // a safetensors path for the trained model; empty: none
};

inline const char* kUsage =
    "usage: train_gpt --data FILE [--steps N] [--micro-batch N] [--seq-len N] [--dim N]\n"
    "                 [--layers N] [--heads N] [--lr X] [--clip X (0: off)] [--seed N]\n"
    "                 [--dtype fp32|bf16] [--strategy fsdp|zero1|zero2] [--log-every N]\n"
    "                 [--threads N] [--save MODEL.safetensors]\n"
    "                 [--pp STAGES [--microbatches N] [--schedule 1f1b|gpipe]] [--tp N]\n"
    "                 [--warmup-steps N] [--checkpoint-dir DIR [--save-every N] [--keep-last N]\n"
    "                 [--checkpoint-mode sync|async]] [--accumulation N] [--deterministic]\n";

// A bool field is a switch: the flag alone, without a value.
using FlagField =
    std::variant<int64_t Flags::*, double Flags::*, std::string Flags::*, bool Flags::*>;

// Every flag and the field it sets.
inline const std::map<std::string, FlagField>& flag_fields() {
  // clang-format off
  static const std::map<std::string, FlagField> fields{
      {"--data", &Flags::data},               {"--steps", &Flags::steps},
      {"--micro-batch", &Flags::micro_batch}, {"--seq-len", &Flags::seq_len},
      {"--dim", &Flags::dim},                 {"--layers", &Flags::layers},
      {"--heads", &Flags::heads},             {"--seed", &Flags::seed},
      {"--log-every", &Flags::log_every},     {"--threads", &Flags::threads},
      {"--pp", &Flags::pp},                   {"--microbatches", &Flags::microbatches},
      {"--tp", &Flags::tp},                   {"--warmup-steps", &Flags::warmup_steps},
      {"--save-every", &Flags::save_every},   {"--keep-last", &Flags::keep_last},
      {"--lr", &Flags::lr},                   {"--clip", &Flags::clip},
      {"--dtype", &Flags::dtype},             {"--strategy", &Flags::strategy},
      {"--schedule", &Flags::schedule},       {"--checkpoint-dir", &Flags::checkpoint_dir},
      {"--save", &Flags::save},               {"--checkpoint-mode", &Flags::checkpoint_mode},
      {"--accumulation", &Flags::accumulation}, {"--deterministic", &Flags::deterministic}};
  // clang-format on
  return fields;
}

// `value` of `flag` as a T; an error naming both when it is not one.
template <typename T>
T number(const std::string& flag, const std::string& value) {
  T parsed{};
  const char* end = value.data() + value.size();
  const auto [stop, error] = std::from_chars(value.data(), end, parsed);
  if (value.empty() || error != std::errc() || stop != end) {
    throw std::invalid_argument(flag + " " + value + ": not a number\n" + kUsage);
  }
  return parsed;
}

// An error naming `flag` unless `value` is one of `choices` ("--dtype fp8: use fp32 or bf16").
inline void one_of(const std::string& flag,
                   const std::string& value,
                   const std::vector<std::string>& choices) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (value == choices[i]) return;
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  throw std::invalid_argument(flag + " " + value + ": use " + list);
}

// The relations between flags; each error names the flags.
inline void check_relations(const Flags& f) {
  auto fail = [](const std::string& message) { throw std::invalid_argument(message); };
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (f.dim % f.heads != 0) fail("--dim must be a multiple of --heads");
  if (f.strategy != "fsdp" && f.dtype != "fp32") {
    fail("--dtype " + f.dtype + " needs --strategy fsdp (ZeRO runs fp32)");
  }
  if (f.warmup_steps > f.steps) {
    fail("--warmup-steps " + n(f.warmup_steps) + " exceeds --steps " + n(f.steps));
  }
  if ((f.pp > 1 || f.tp > 1) && f.strategy_given) {
    fail("--strategy " + f.strategy +
         " with --pp or --tp: their groups are data parallel with replicated weights; leave "
         "--strategy out (it applies without --pp and --tp)");
  }
  if ((f.pp > 1 || f.tp > 1) && f.dtype != "fp32")
    fail("--pp and --tp run fp32; leave --dtype out");
  for (const auto& [what, value] : std::map<std::string, int64_t>{
           {"--heads", f.heads}, {"--dim", f.dim}, {"the vocabulary size", 256}}) {
    if (value % f.tp != 0) fail("--tp " + n(f.tp) + " must divide " + what + " (" + n(value) + ")");
  }
  if (f.pp > 1 && f.micro_batch % f.microbatches != 0) {
    fail("--micro-batch " + n(f.micro_batch) + " must be a multiple of --microbatches " +
         n(f.microbatches));
  }
  if (f.pp > f.layers + 2) {
    fail("--pp " + n(f.pp) + ": at most --layers + 2 (" + n(f.layers + 2) + ") stages");
  }
  if (f.pp > 1 && f.accumulation > 1) {
    fail(
        "--accumulation with --pp: the pipeline's --microbatches are its accumulation; leave "
        "--accumulation out");
  }
  if (f.deterministic && f.tp > 1) {
    fail(
        "--deterministic with --tp: tensor parallelism changes the matmuls' own reduction "
        "order, outside the mode's contract; leave one of them out");
  }
  if (f.deterministic && f.threads > 1) {
    fail(
        "--deterministic runs one intra-op thread (a BLAS may split a reduction over its "
        "threads); leave --threads out");
  }
}

// Throws std::invalid_argument naming the flag and the fix for a bad or conflicting value.
inline void check(const Flags& f) {
  if (f.data.empty()) throw std::invalid_argument(std::string("--data is required\n") + kUsage);
  for (const auto& [flag, field] : flag_fields()) {
    const auto* member = std::get_if<int64_t Flags::*>(&field);
    const bool may_be_zero = flag == "--seed" || flag == "--threads" || flag == "--warmup-steps";
    if (member && f.**member < (may_be_zero ? 0 : 1)) {
      throw std::invalid_argument(flag + " must be positive");
    }
  }
  one_of("--dtype", f.dtype, {"fp32", "bf16"});
  one_of("--strategy", f.strategy, {"fsdp", "zero1", "zero2"});
  one_of("--schedule", f.schedule, {"1f1b", "gpipe"});
  one_of("--checkpoint-mode", f.checkpoint_mode, {"sync", "async"});
  check_relations(f);
}

inline Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    const auto field = flag_fields().find(flag);
    if (field == flag_fields().end()) {
      throw std::invalid_argument("unknown flag " + flag + "\n" + kUsage);
    }
    if (const auto* on = std::get_if<bool Flags::*>(&field->second)) {
      f.** on = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    std::visit(
        [&](auto member) {
          using T = std::decay_t<decltype(f.*member)>;
          if constexpr (std::is_same_v<T, std::string>) {
            f.*member = value;
          } else if constexpr (std::is_same_v<T, bool>) {
            f.*member = true;  // switches are handled above
          } else {
            f.*member = number<T>(flag, value);
          }
        },
        field->second);
    f.strategy_given = f.strategy_given || flag == "--strategy";
  }
  check(f);
  return f;
}
