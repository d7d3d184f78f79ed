#include "zero/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <string>

namespace shardwise::zero {
namespace {

const char* kStateNames[] = {"master", "exp_avg", "exp_avg_sq", "momentum"};

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params,
                                                 ZeroOptions options)
    : torch::optim::Optimizer(params, std::make_unique<ZeroRedundancyOptions>(options)) {
  TORCH_CHECK(options.stage >= 0 && options.stage <= 2, "ZeroRedundancyOptimizer: stage ",
              options.stage,
              " is not 0, 1 or 2; for stage 3 shard the model with "
              "fsdp::FullyShardedDataParallel and step its shards with optim::FusedAdamW");
  engine_ = ZeroOptimizer::create(std::move(params), std::move(options));
}

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  engine_->set_lr(param_groups().at(0).options().get_lr());
  last_taken_ = engine_->step();
  return loss;
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  torch::optim::Optimizer::zero_grad(set_to_none);
  engine_->zero_grad();
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  const auto pieces = engine_->state_pieces();
  archive.write("zero/step_count", at::tensor({engine_->step_count()}, at::kLong));
  archive.write("zero/pieces", at::tensor({static_cast<int64_t>(pieces.size())}, at::kLong));
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& info = pieces[k].info;
    const std::string prefix = "zero/piece" + std::to_string(k) + "/";
    archive.write(prefix + "info",
                  at::tensor({info.param, info.start, info.numel, info.full_numel}, at::kLong));
    for (const auto& [name, tensor] : pieces[k].tensors) archive.write(prefix + name, tensor);
  }
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  at::Tensor step_count, count;
  TORCH_CHECK(
      archive.try_read("zero/step_count", step_count) && archive.try_read("zero/pieces", count),
      "ZeroRedundancyOptimizer::load: the archive was not written by "
      "ZeroRedundancyOptimizer::save (no zero/step_count)");
  std::vector<StatePiece> pieces(count.item<int64_t>());
  for (size_t k = 0; k < pieces.size(); ++k) {
    const std::string prefix = "zero/piece" + std::to_string(k) + "/";
    at::Tensor info;
    archive.read(prefix + "info", info);
    const auto* v = info.data_ptr<int64_t>();
    pieces[k].info = PieceInfo{v[0], v[1], v[2], v[3]};
    for (const char* name : kStateNames) {
      at::Tensor tensor;
      if (archive.try_read(prefix + name, tensor)) pieces[k].tensors[name] = tensor;
    }
  }
  engine_->load_state_pieces(pieces, step_count.item<int64_t>());
}

}  // namespace shardwise::zero
