// The checkpoint hooks of checkpoint_hooks.h.
#include "training/checkpoint_hooks.h"

#include <algorithm>
#include <stdexcept>

#include "optim/adamw_slots.h"
#include "tensor_parallel/shard_tensor.h"
#include "training/checkpoint_writer.h"

namespace shardwise::training {

std::vector<ParameterSource> written_sources(std::vector<ParameterSource> sources,
                                             const mesh::MeshLayout& layout,
                                             int rank,
                                             const std::vector<std::string>& tied) {
  std::vector<ParameterSource> out;
  for (auto& source : sources) {
    ParameterPlacement placement;
    placement.tp_split = source.split.has_value();
    placement.tied = std::find(tied.begin(), tied.end(), source.name) != tied.end();
    if (writes(layout, rank, placement)) out.push_back(std::move(source));
  }
  return out;
}

Slots source_slots(const std::vector<ParameterSource>& sources) {
  Slots out;
  for (const ParameterSource& source : sources) {
    const torch::Tensor flat = source.value.detach();
    auto slices =
        source.split
            ? tensor_parallel::shard_slices(source.name, flat, source.full_shape, *source.split)
            : std::vector<sharding::TensorSlice>{{source.name, 0, flat.view(-1)}};
    for (auto& slice : slices) {
      out.first.push_back(std::move(slice));
      out.second.push_back(source.value);
    }
  }
  return out;
}

ParameterSlots sharded_slots(std::shared_ptr<const tensor_parallel::ShardedParameters> params,
                             mesh::MeshLayout layout,
                             int rank) {
  if (!params) throw std::invalid_argument("sharded_slots: params is null");
  return [params = std::move(params), layout = std::move(layout), rank](bool saving) {
    std::vector<ParameterSource> sources;
    for (const auto& [name, value] : params->named()) {
      sources.push_back({name, value, params->spec(name), params->full_shape(name)});
    }
    return source_slots(saving ? written_sources(sources, layout, rank) : sources);
  };
}

CheckpointHooks adamw_checkpoint(ParameterSlots parameter_slots,
                                 std::shared_ptr<torch::optim::AdamW> optimizer) {
  auto slots = [parameter_slots, optimizer](bool saving) {
    const auto [views, params] = parameter_slots(saving);
    return optim::adamw_slots(views, params, *optimizer, /*create_state=*/!saving);
  };
  CheckpointHooks hooks;
  hooks.save = [slots, optimizer](checkpoint::TrainingState& state) {
    state.pieces = slots(/*saving=*/true);
    state.optimizer_step = optim::adamw_step_count(*optimizer);
  };
  hooks.load = [slots, optimizer](const std::vector<checkpoint::TrainingState>& saved,
                                  const std::string& path) {
    if (saved[0].zero) {
      throw std::invalid_argument(path +
                                  ": a ZeRO checkpoint; resume it with a ZeRO optimizer "
                                  "(zero::ZeroRedundancyOptimizer, zero_checkpoint)");
    }
    std::vector<sharding::TensorSlice> pieces;
    for (const auto& rank : saved)
      pieces.insert(pieces.end(), rank.pieces.begin(), rank.pieces.end());
    at::NoGradGuard no_grad;
    sharding::fill_from_pieces(slots(/*saving=*/false), pieces, /*strict=*/true);
    optim::set_adamw_step_count(*optimizer, saved[0].optimizer_step);
  };
  return hooks;
}

CheckpointHooks zero_checkpoint(std::shared_ptr<zero::ZeroRedundancyOptimizer> optimizer) {
  CheckpointHooks hooks;
  hooks.save = [optimizer](checkpoint::TrainingState& state) {
    auto& engine = optimizer->engine();
    state.zero =
        checkpoint::ZeroCheckpoint{engine.state_pieces(), engine.step_count(), engine.step_count()};
    state.optimizer_step = engine.step_count();
  };
  hooks.load = [optimizer](const std::vector<checkpoint::TrainingState>& saved,
                           const std::string& path) {
    if (!saved[0].zero) {
      throw std::invalid_argument(path +
                                  ": not a ZeRO checkpoint; resume it with AdamW and the "
                                  "strategy's parameter slots (adamw_checkpoint)");
    }
    std::vector<zero::StatePiece> pieces;
    for (const auto& rank : saved) {
      pieces.insert(pieces.end(), rank.zero->pieces.begin(), rank.zero->pieces.end());
    }
    optimizer->engine().load_state_pieces(pieces, saved[0].zero->step);
  };
  return hooks;
}

}  // namespace shardwise::training
