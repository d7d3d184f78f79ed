#include "data/token_stream.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "data/token_file_tensor.h"

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

at::Tensor read_byte_tokens(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read the token file '" + path + "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.empty()) throw std::runtime_error("the token file '" + path + "' is empty");
  at::Tensor tokens = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(tokens.data_ptr<uint8_t>()));
  return tokens;
}

std::pair<at::Tensor, at::Tensor> split_tokens(const at::Tensor& tokens, double val_fraction) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw std::invalid_argument("val_fraction must be in (0, 1), got " +
                                std::to_string(val_fraction));
  }
  const int64_t n = tokens.numel();
  // std::nearbyint rounds half to even, as Python's round() does.
  const int64_t n_val = std::max<int64_t>(1, std::llround(std::nearbyint(n * val_fraction)));
  return {tokens.narrow(0, 0, n - n_val), tokens.narrow(0, n - n_val, n_val)};
}

TokenStream::TokenStream(at::Tensor tokens, TokenStreamOptions options)
    : tokens_(tokens.reshape(-1)), options_(options) {
  if (options.seq_len < 1 || options.micro_batch < 1 || options.data_world < 1) {
    throw std::invalid_argument(
        "TokenStreamOptions: seq_len, micro_batch and data_world must be positive");
  }
  if (options.data_rank < 0 || options.data_rank >= options.data_world) {
    throw std::invalid_argument("TokenStreamOptions: data_rank " +
                                std::to_string(options.data_rank) + " outside [0, " +
                                std::to_string(options.data_world) + ")");
  }
  num_windows_ = (tokens_.numel() - 1) / options.seq_len;
  batches_per_epoch_ = num_windows_ / (options.micro_batch * options.data_world);
  if (batches_per_epoch_ < 1) {
    throw std::invalid_argument(
        std::to_string(tokens_.numel()) + " tokens make " + std::to_string(num_windows_) +
        " windows of " + std::to_string(options.seq_len) + ": fewer than one global batch (" +
        std::to_string(options.micro_batch) + " x " + std::to_string(options.data_world) +
        " data ranks)");
  }
}

at::Tensor TokenStream::window_order(int64_t epoch) const {
  if (!options_.shuffle) return at::arange(num_windows_, at::kLong);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(epoch_seed(options_.seed, epoch));
  return at::randperm(num_windows_, generator, at::TensorOptions().dtype(at::kLong));
}

at::Tensor TokenStream::batch_windows(int64_t epoch, int64_t index) {
  if (epoch != order_epoch_) {
    order_ = window_order(epoch);
    order_epoch_ = epoch;
  }
  const int64_t per_global = options_.micro_batch * options_.data_world;
  return order_.narrow(0, index * per_global, per_global)
      .slice(0, options_.data_rank, per_global, options_.data_world);
}

std::pair<at::Tensor, at::Tensor> TokenStream::batch(int64_t epoch, int64_t index) {
  const at::Tensor starts = batch_windows(epoch, index) * options_.seq_len;
  const at::Tensor offsets = at::arange(options_.seq_len + 1, at::kLong);
  const at::Tensor positions = starts.unsqueeze(1) + offsets.unsqueeze(0);
  // unsigned files (uint16, uint32) are gathered through a signed view of the same bytes
  const at::Tensor gathered = signed_view(tokens_).index_select(0, positions.reshape(-1));
  const at::Tensor windows =
      token_ids(gathered.view(tokens_.scalar_type())).view(positions.sizes());
  return {windows.slice(1, 0, options_.seq_len).contiguous(),
          windows.slice(1, 1, options_.seq_len + 1).contiguous()};
}

std::pair<at::Tensor, at::Tensor> TokenStream::next() {
  auto out = batch(epoch_, index_);
  if (++index_ == batches_per_epoch_) {
    ++epoch_;
    index_ = 0;
  }
  return out;
}

void TokenStream::load_state(int64_t epoch, int64_t index) {
  if (epoch < 0 || index < 0 || index >= batches_per_epoch_) {
    throw std::invalid_argument("TokenStream::load_state: position (epoch " +
                                std::to_string(epoch) + ", index " + std::to_string(index) +
                                ") is invalid (" + std::to_string(batches_per_epoch_) +
                                " batches per epoch)");
  }
  epoch_ = epoch;
  index_ = index;
}

}  // namespace shardwise::data
