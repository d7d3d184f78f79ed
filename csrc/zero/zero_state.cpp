// Optimizer state as world-size-independent pieces: every state tensor of this rank is described
// by (parameter, first element, count), so loading copies the overlap of each saved piece with
// each of this rank's pieces, whatever world size either side had.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "zero/zero_optimizer.h"

namespace shardwise::zero {
namespace {

std::vector<std::string> state_names(OptimizerKind kind) {
  if (kind != OptimizerKind::kSgd) return {"master", "exp_avg", "exp_avg_sq"};
  return {"master", "momentum"};
}

}  // namespace

// This rank's pieces as views: (info, tensors by name), in the order of pieces_.
std::vector<StatePiece> ZeroOptimizer::state_pieces() const {
  const std::vector<std::string> names = state_names(options_.optimizer.kind);
  std::vector<StatePiece> out;
  for_each_piece([&](size_t k, size_t master, int64_t offset) {
    const PieceInfo& info = pieces_[k];
    StatePiece piece{info, {}};
    piece.tensors[names[0]] = masters_[master].narrow(0, offset, info.numel);
    for (size_t s = 1; s < names.size(); ++s) {
      piece.tensors[names[s]] = state_[master][s - 1].narrow(0, offset, info.numel);
    }
    out.push_back(std::move(piece));
  });
  return out;
}

// Local mode: piece k is the whole shard masters_[k]. Partitioned: the pieces of each bucket's
// parameters, in bucket order, inside the one flat partition.
void ZeroOptimizer::for_each_piece(const std::function<void(size_t, size_t, int64_t)>& fn) const {
  size_t k = 0;
  if (local_) {
    for (; k < pieces_.size(); ++k) fn(k, k, 0);
    return;
  }
  for (const Bucket& bucket : buckets_) {
    for (size_t j = 0; j < bucket.params.size(); ++j, ++k) {
      fn(k, 0, bucket.offset + bucket.layout.offset(static_cast<int64_t>(j)));
    }
  }
}

void ZeroOptimizer::load_state_pieces(const std::vector<StatePiece>& saved, int64_t step_count) {
  at::NoGradGuard no_grad;
  const std::vector<std::string> names = state_names(options_.optimizer.kind);
  for (const StatePiece& mine : state_pieces()) {
    int64_t covered = 0;
    for (const StatePiece& theirs : saved) {
      if (theirs.info.param != mine.info.param) continue;
      TORCH_CHECK_VALUE(theirs.info.full_numel == mine.info.full_numel,
                        "ZeRO checkpoint: ", "parameter ", mine.info.param, " has ",
                        theirs.info.full_numel, " elements in the checkpoint but ",
                        mine.info.full_numel, " in the model; load it into the same model");
      const int64_t lo = std::max(mine.info.start, theirs.info.start);
      const int64_t hi =
          std::min(mine.info.start + mine.info.numel, theirs.info.start + theirs.info.numel);
      if (hi <= lo) continue;
      for (const std::string& name : names) {
        auto it = theirs.tensors.find(name);
        TORCH_CHECK_VALUE(it != theirs.tensors.end(), "ZeRO checkpoint: a piece of parameter ",
                          mine.info.param, " has no '", name, "'; it was saved with another ",
                          "optimizer type");
        mine.tensors.at(name)
            .narrow(0, lo - mine.info.start, hi - lo)
            .copy_(it->second.reshape(-1).narrow(0, lo - theirs.info.start, hi - lo));
      }
      covered += hi - lo;
    }
    TORCH_CHECK_VALUE(covered == mine.info.numel, "ZeRO checkpoint: covers ", covered, " of the ",
                      mine.info.numel, " elements this rank needs of parameter ", mine.info.param,
                      "; pass the pieces saved by every rank");
  }
  step_count_ = step_count;
  if (!local_) {
    const at::ScalarType dtype = params_[0].scalar_type();
    gather_parameters(dtype == at::kFloat ? masters_[0] : masters_[0].to(dtype));
  }
}

void ZeroOptimizer::set_scaler_state(const LossScalerState& state) {
  TORCH_CHECK_VALUE(scaler_ != nullptr, "ZeRO: this optimizer has no loss scaler (fp16 is off)");
  scaler_->set_state(state);
}

int64_t ZeroOptimizer::master_bytes() const {
  if (local_) return 0;  // stage 3: the masters are the FSDP engine's parameter shards
  int64_t bytes = 0;
  for (const at::Tensor& t : masters_) bytes += t.nbytes();
  return bytes;
}

int64_t ZeroOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& tensors : state_) {
    for (const at::Tensor& t : tensors) bytes += t.nbytes();
  }
  return bytes;
}

int64_t ZeroOptimizer::grad_partition_bytes() const {
  return grad_partition_.defined() ? static_cast<int64_t>(grad_partition_.nbytes()) : 0;
}

}  // namespace shardwise::zero
