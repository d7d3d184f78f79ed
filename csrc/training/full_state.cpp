// The full state across the mesh of full_state.h.
#include "training/full_state.h"

#include <optional>
#include <stdexcept>

namespace shardwise::training {
namespace {

// The device of this rank's own values (the first defined one); CPU when it holds none.
torch::Device own_device(const std::vector<std::vector<StagedParameter>>& stages) {
  for (const auto& stage : stages) {
    for (const StagedParameter& p : stage) {
      if (p.value.defined()) return p.value.device();
    }
  }
  return torch::kCPU;
}

void check_stages(const FullStatePlace& place,
                  const std::vector<std::vector<StagedParameter>>& stages) {
  const int pp = place.layout.size("pp");
  if (stages.empty() || stages.size() % pp != 0) {
    throw std::invalid_argument("gather_full_state: " + std::to_string(stages.size()) +
                                " stages listed for a mesh of pp = " + std::to_string(pp) +
                                "; list every stage (a multiple of pp)");
  }
  if (pp > 1 && !place.pp_group) {
    throw std::invalid_argument("gather_full_state: a mesh of pp = " + std::to_string(pp) +
                                " needs place.pp_group");
  }
}

}  // namespace

torch::OrderedDict<std::string, torch::Tensor> gather_full_state(
    const FullStatePlace& place,
    const std::vector<std::vector<StagedParameter>>& stages,
    const GatherTp& gather_tp) {
  check_stages(place, stages);
  torch::OrderedDict<std::string, torch::Tensor> full;
  const mesh::MeshLayout& layout = place.layout;
  if (layout.coordinate(place.rank, "dp") != 0 || layout.coordinate(place.rank, "fsdp") != 0) {
    return full;
  }
  const int pp = layout.size("pp"), coordinate = layout.coordinate(place.rank, "pp");
  const bool sends = layout.coordinate(place.rank, "tp") == 0;
  const torch::Device device = own_device(stages);
  for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
    const int owner = s % pp;
    for (const StagedParameter& p : stages[s]) {
      std::vector<torch::Tensor> tensor(1);
      if (owner == coordinate) {
        if (!p.value.defined()) {
          throw std::invalid_argument("gather_full_state: stage " + std::to_string(s) + " lists " +
                                      p.name + " without this rank's value");
        }
        tensor[0] = (gather_tp ? gather_tp(p.name, p.value) : p.value.detach()).to(p.dtype);
        // A copy, never the live parameter (a replicated tensor comes back from gather_tp as is).
        if (tensor[0].is_alias_of(p.value)) tensor[0] = tensor[0].clone();
      }
      if (owner != coordinate && coordinate == 0 && sends) {
        tensor[0] = torch::empty(p.full_shape, torch::TensorOptions(device).dtype(p.dtype));
        place.pp_group->recv(tensor, owner, s)->wait();
      }
      if (owner == coordinate && coordinate != 0 && sends) {
        tensor[0] = tensor[0].contiguous();
        place.pp_group->send(tensor, 0, s)->wait();
      }
      if (coordinate == 0 && sends) full.insert(p.name, tensor[0].contiguous());
    }
  }
  return full;
}

torch::OrderedDict<std::string, torch::Tensor> gather_full_state(
    distributed::DeviceMesh& mesh,
    const std::vector<std::vector<StagedParameter>>& stages,
    const GatherTp& gather_tp) {
  FullStatePlace place{mesh.layout(), mesh.rank(), nullptr};
  if (mesh.size("pp") > 1) place.pp_group = mesh.group({"pp"});
  return gather_full_state(place, stages, gather_tp);
}

}  // namespace shardwise::training
