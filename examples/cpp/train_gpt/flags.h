// train_gpt's command line: the flags, their defaults and the checks that name a bad one before
// anything runs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

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

inline const char* kUsage =
    "usage: train_gpt --data FILE [--steps N] [--micro-batch N] [--seq-len N] [--dim N]\n"
    "                 [--layers N] [--heads N] [--lr X] [--clip X (0: off)] [--seed N]\n"
    "                 [--dtype fp32|bf16] [--strategy fsdp|zero1|zero2] [--log-every N]\n"
    "                 [--threads N] [--save MODEL.safetensors]\n"
    "                 [--pp STAGES [--microbatches N] [--schedule 1f1b|gpipe]] [--tp N]\n"
    "                 [--warmup-steps N] [--checkpoint-dir DIR [--save-every N] [--keep-last N]]\n";

// `value` of `flag` as a number; an error naming both when it is not one.
inline double number(const std::string& flag, const std::string& value, bool integer) {
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

// The integer flags and the fields they set.
inline const std::map<std::string, int64_t Flags::*>& integer_flags() {
  static const std::map<std::string, int64_t Flags::*> flags{
      {"--steps", &Flags::steps},
      {"--micro-batch", &Flags::micro_batch},
      {"--seq-len", &Flags::seq_len},
      {"--dim", &Flags::dim},
      {"--layers", &Flags::layers},
      {"--heads", &Flags::heads},
      {"--seed", &Flags::seed},
      {"--log-every", &Flags::log_every},
      {"--threads", &Flags::threads},
      {"--pp", &Flags::pp},
      {"--microbatches", &Flags::microbatches},
      {"--tp", &Flags::tp},
      {"--warmup-steps", &Flags::warmup_steps},
      {"--save-every", &Flags::save_every},
      {"--keep-last", &Flags::keep_last}};
  return flags;
}

// Throws std::invalid_argument naming the flag and the fix for a bad or conflicting value.
inline void check(const Flags& f) {
  if (f.data.empty()) throw std::invalid_argument(std::string("--data is required\n") + kUsage);
  for (const auto& [flag, member] : integer_flags()) {
    if (f.*member < (flag == "--seed" || flag == "--threads" || flag == "--warmup-steps" ? 0 : 1)) {
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
  if (f.warmup_steps > f.steps) {
    throw std::invalid_argument("--warmup-steps " + std::to_string(f.warmup_steps) +
                                " exceeds --steps " + std::to_string(f.steps));
  }
  if (f.schedule != "1f1b" && f.schedule != "gpipe") {
    throw std::invalid_argument("--schedule " + f.schedule + ": use 1f1b or gpipe");
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
}

inline Flags parse(int argc, char** argv) {
  Flags f;
  std::map<std::string, double*> reals{{"--lr", &f.lr}, {"--clip", &f.clip}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    const bool text = flag == "--data" || flag == "--dtype" || flag == "--strategy" ||
                      flag == "--save" || flag == "--schedule" || flag == "--checkpoint-dir";
    if (!text && !integer_flags().count(flag) && !reals.count(flag)) {
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
    } else if (integer_flags().count(flag)) {
      f.*integer_flags().at(flag) = static_cast<int64_t>(number(flag, value, /*integer=*/true));
    } else {
      *reals[flag] = number(flag, value, /*integer=*/false);
    }
  }
  check(f);
  return f;
}
