#include "data/batch_order.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>

namespace shardwise::data {
namespace {

constexpr int64_t kSeedStride = 1000003;  // mixes (seed, epoch) into one generator seed

// (seed * kSeedStride + epoch) mod 2^63, non-negative, as Python computes it.
uint64_t epoch_seed(int64_t seed, int64_t epoch) {
  const __int128 modulus = static_cast<__int128>(1) << 63;
  __int128 mixed = (static_cast<__int128>(seed) * kSeedStride + epoch) % modulus;
  if (mixed < 0) mixed += modulus;
  return static_cast<uint64_t>(mixed);
}

}  // namespace

int64_t BatchOrder::whole_batches(int64_t num_items,
                                  int64_t micro_batch,
                                  int data_world,
                                  int64_t batches_per_step) {
  return num_items / (micro_batch * data_world * batches_per_step) * batches_per_step;
}

std::string BatchOrder::step_text(int64_t micro_batch, int data_world, int64_t batches_per_step) {
  std::string text =
      std::to_string(micro_batch) + " x " + std::to_string(data_world) + " data ranks";
  if (batches_per_step > 1) text += " x " + std::to_string(batches_per_step) + " batches per step";
  return text;
}

BatchOrder::BatchOrder(int64_t num_items, BatchOrderOptions options)
    : num_items_(num_items), options_(options) {
  if (options.micro_batch < 1 || options.data_world < 1 || options.batches_per_step < 1) {
    throw std::invalid_argument(
        "BatchOrderOptions: micro_batch, data_world and batches_per_step must be positive");
  }
  if (options.data_rank < 0 || options.data_rank >= options.data_world) {
    throw std::invalid_argument("BatchOrderOptions: data_rank " +
                                std::to_string(options.data_rank) + " outside [0, " +
                                std::to_string(options.data_world) + ")");
  }
  batches_per_epoch_ =
      whole_batches(num_items, options.micro_batch, options.data_world, options.batches_per_step);
  if (batches_per_epoch_ < 1) {
    throw std::invalid_argument(
        std::to_string(num_items) + " items: fewer than one global batch (" +
        step_text(options.micro_batch, options.data_world, options.batches_per_step) + ")");
  }
}

at::Tensor BatchOrder::order(int64_t epoch) const {
  if (!options_.shuffle) return at::arange(num_items_, at::kLong);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(epoch_seed(options_.seed, epoch));
  return at::randperm(num_items_, generator, at::TensorOptions().dtype(at::kLong));
}

at::Tensor BatchOrder::batch_items(int64_t epoch, int64_t index) {
  if (epoch != order_epoch_) {
    order_ = order(epoch);
    order_epoch_ = epoch;
  }
  const int64_t per_global = options_.micro_batch * options_.data_world;
  const at::Tensor global = order_.narrow(0, index * per_global, per_global);
  if (options_.contiguous) {
    return global.narrow(0, options_.data_rank * options_.micro_batch, options_.micro_batch);
  }
  return global.slice(0, options_.data_rank, per_global, options_.data_world);
}

at::Tensor BatchOrder::next() {
  at::Tensor items = batch_items(epoch_, index_);
  if (++index_ == batches_per_epoch_) {
    ++epoch_;
    index_ = 0;
  }
  return items;
}

void BatchOrder::load_state(int64_t epoch, int64_t index) {
  if (epoch < 0 || index < 0 || index >= batches_per_epoch_) {
    throw std::invalid_argument("load_state: position (epoch " + std::to_string(epoch) +
                                ", index " + std::to_string(index) + ") is invalid (" +
                                std::to_string(batches_per_epoch_) + " batches per epoch)");
  }
  epoch_ = epoch;
  index_ = index;
}

}  // namespace shardwise::data
