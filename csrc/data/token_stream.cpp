#include "data/token_stream.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "data/token_file_tensor.h"

namespace shardwise::data {
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

namespace {

// The windows of seq_len + 1 tokens in `tokens` (starting every seq_len tokens), checked to
// fill one global batch, as the items of a BatchOrder.
BatchOrder windows_of(const at::Tensor& tokens, const TokenStreamOptions& options) {
  if (options.seq_len < 1 || options.micro_batch < 1 || options.data_world < 1 ||
      options.batches_per_step < 1) {
    throw std::invalid_argument(
        "TokenStreamOptions: seq_len, micro_batch, data_world and batches_per_step must be "
        "positive");
  }
  const int64_t num_windows = (tokens.numel() - 1) / options.seq_len;
  if (BatchOrder::whole_batches(num_windows, options.micro_batch, options.data_world,
                                options.batches_per_step) < 1) {
    throw std::invalid_argument(
        std::to_string(tokens.numel()) + " tokens make " + std::to_string(num_windows) +
        " windows of " + std::to_string(options.seq_len) + ": fewer than one global batch (" +
        BatchOrder::step_text(options.micro_batch, options.data_world, options.batches_per_step) +
        ")");
  }
  return BatchOrder(num_windows,
                    {options.micro_batch, options.data_rank, options.data_world, options.seed,
                     options.shuffle, options.contiguous, options.batches_per_step});
}

}  // namespace

TokenStream::TokenStream(at::Tensor tokens, TokenStreamOptions options)
    : tokens_(tokens.reshape(-1)), options_(options), windows_(windows_of(tokens_, options)) {}

at::Tensor TokenStream::window_order(int64_t epoch) const { return windows_.order(epoch); }

at::Tensor TokenStream::batch_windows(int64_t epoch, int64_t index) {
  return windows_.batch_items(epoch, index);
}

std::pair<at::Tensor, at::Tensor> TokenStream::read_windows(const at::Tensor& windows) const {
  const at::Tensor starts = windows * options_.seq_len;
  const at::Tensor offsets = at::arange(options_.seq_len + 1, at::kLong);
  const at::Tensor positions = starts.unsqueeze(1) + offsets.unsqueeze(0);
  // unsigned files (uint16, uint32) are gathered through a signed view of the same bytes
  const at::Tensor gathered = signed_view(tokens_).index_select(0, positions.reshape(-1));
  const at::Tensor window_tokens =
      token_ids(gathered.view(tokens_.scalar_type())).view(positions.sizes());
  return {window_tokens.slice(1, 0, options_.seq_len).contiguous(),
          window_tokens.slice(1, 1, options_.seq_len + 1).contiguous()};
}

std::pair<at::Tensor, at::Tensor> TokenStream::batch(int64_t epoch, int64_t index) {
  return read_windows(batch_windows(epoch, index));
}

std::pair<at::Tensor, at::Tensor> TokenStream::next() { return read_windows(windows_.next()); }

}  // namespace shardwise::data
