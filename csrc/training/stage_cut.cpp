// The pipeline cut's training rules of stage_cut.h.
#include "training/stage_cut.h"

#include <stdexcept>
#include <utility>

namespace shardwise::training {

StageCut::StageCut(std::vector<pipeline::PipelineBlock> blocks,
                   std::vector<std::vector<int>> groups,
                   int stage,
                   Tie tie,
                   std::shared_ptr<const tensor_parallel::ShardedParameters> sharded)
    : blocks_(std::move(blocks)),
      groups_(std::move(groups)),
      stage_(stage),
      tie_(std::move(tie)),
      sharded_(std::move(sharded)) {
  if (stage_ < 0 || stage_ >= static_cast<int>(groups_.size())) {
    throw std::invalid_argument("StageCut: stage " + std::to_string(stage_) + " of a cut into " +
                                std::to_string(groups_.size()) + " stages");
  }
  mine_ = pipeline::stage_of(blocks_, groups_[stage_], stage_);
}

std::string StageCut::model_name(const std::string& name) const {
  return !tie_.copy.empty() && name == tie_.copy ? tie_.name : name;
}

double StageCut::clip_grad_norm(double max_norm,
                                const c10::intrusive_ptr<c10d::ProcessGroup>& stage_group) const {
  tensor_parallel::ClipOptions options;
  options.max_norm = max_norm;
  if (sharded_) options.tp_group = sharded_->group();
  options.stage_group = stage_group;
  auto split = [this](const std::string& name) {
    return sharded_ && sharded_->split(model_name(name));
  };
  std::vector<std::string> copies;
  if (!tie_.copy.empty()) copies.push_back(tie_.copy);
  return clip_grad_norm_over_mesh(mesh_gradients(mine_.parameters, split, copies), options);
}

std::vector<std::vector<StagedParameter>> StageCut::staged() const {
  std::vector<std::vector<StagedParameter>> stages(groups_.size());
  for (size_t s = 0; s < groups_.size(); ++s) {
    for (int i : groups_[s]) {
      for (const auto& [name, p] : blocks_[i].parameters) {
        if (!tie_.copy.empty() && name == tie_.copy) continue;
        stages[s].push_back({name, sharded_ ? sharded_->full_shape(name) : p.sizes().vec(),
                             static_cast<int>(s) == stage_ ? p : torch::Tensor()});
      }
    }
  }
  return stages;
}

torch::OrderedDict<std::string, torch::Tensor> StageCut::full_state(
    distributed::DeviceMesh& mesh) const {
  GatherTp gather;
  if (sharded_) {
    gather = [this](const std::string& name, const torch::Tensor& value) {
      return sharded_->gather(name, value);
    };
  }
  return gather_full_state(mesh, staged(), gather);
}

std::vector<ParameterSource> StageCut::sources() const {
  std::vector<ParameterSource> out;
  for (const auto& [name, p] : mine_.parameters) {
    const std::string full = model_name(name);
    if (sharded_) {
      out.push_back({full, p, sharded_->spec(full), sharded_->full_shape(full)});
    } else {
      out.push_back({full, p});
    }
  }
  return out;
}

ParameterSlots StageCut::slots(std::shared_ptr<distributed::DeviceMesh> mesh) const {
  return [cut = *this, mesh](bool saving) {  // a copy: the slots outlive no one
    auto sources = cut.sources();
    if (saving) {
      std::vector<std::string> tied;
      if (!cut.tie_.copy.empty()) tied.push_back(cut.tie_.name);
      sources = written_sources(sources, mesh->layout(), mesh->rank(), tied);
    }
    return source_slots(sources);
  };
}

}  // namespace shardwise::training
