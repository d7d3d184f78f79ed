#include "training/async_run_checkpoint.h"

#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "checkpoint/training_checkpoint.h"

namespace shardwise::training {
namespace {

at::Tensor host_copy(const at::Tensor& t) {
  return t.defined() ? t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : t;
}

// The state with every tensor copied to the CPU: the live parameters and moments may change
// while the writer writes.
checkpoint::TrainingState host_state(checkpoint::TrainingState state) {
  for (sharding::TensorSlice& piece : state.pieces) piece.values = host_copy(piece.values);
  if (state.zero) {
    for (zero::StatePiece& piece : state.zero->pieces) {
      for (auto& [name, tensor] : piece.tensors) tensor = host_copy(tensor);
    }
  }
  state.rng = host_copy(state.rng);
  return state;
}

}  // namespace

AsyncRunCheckpoints::AsyncRunCheckpoints(const distributed::World& world,
                                         RunCheckpointOptions options)
    : rank_(world.rank()), world_size_(world.size()), options_(std::move(options)) {
  if (world_size_ > 1) {
    std::vector<int> ranks(world_size_);
    std::iota(ranks.begin(), ranks.end(), 0);
    group_ = distributed::new_group(world.store, ranks, rank_, "async_checkpoints");
  }
}

AsyncRunCheckpoints::~AsyncRunCheckpoints() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "shardwise: " << e.what() << std::endl;
  }
}

void AsyncRunCheckpoints::save(int64_t step,
                               const CheckpointHooks& hooks,
                               const data::TokenStream& stream) {
  const auto start = std::chrono::steady_clock::now();
  wait();
  checkpoint::TrainingState state = host_state(training_state(step, hooks, stream));
  checkpoint::SaveOptions save;
  save.directory = options_.directory;
  save.rank = rank_;
  save.world_size = world_size_;
  save.config_yaml = options_.config_yaml;
  save.keep_last = options_.keep_last;
  if (group_) {
    auto group = group_;
    save.barrier = [group] { group->barrier()->wait(); };
  }
  step_ = step;
  writer_ = std::thread([this, state = std::move(state), save = std::move(save)] {
    try {
      checkpoint::save_training_checkpoint(state, save);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
  blocked_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void AsyncRunCheckpoints::wait() {
  if (writer_.joinable()) writer_.join();
  if (!error_) return;
  std::exception_ptr error = std::exchange(error_, nullptr);
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    throw std::runtime_error("asynchronous checkpoint of step " + std::to_string(step_) +
                             " failed: " + e.what());
  }
}

}  // namespace shardwise::training
