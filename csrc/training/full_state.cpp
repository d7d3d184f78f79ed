// The full state across the mesh of full_state.h.
#include "training/full_state.h"

#include <stdexcept>

namespace shardwise::training {

torch::OrderedDict<std::string, torch::Tensor> gather_full_state(
    distributed::DeviceMesh& mesh,
    const std::vector<std::vector<StagedParameter>>& stages,
    const GatherTp& gather_tp) {
  torch::OrderedDict<std::string, torch::Tensor> full;
  if (static_cast<int>(stages.size()) != mesh.size("pp")) {
    throw std::invalid_argument("gather_full_state: " + std::to_string(stages.size()) +
                                " stages listed for a mesh of pp = " +
                                std::to_string(mesh.size("pp")) + "; list every stage");
  }
  if (mesh.coordinate("dp") != 0) return full;
  const auto pp_group = stages.size() > 1 ? mesh.group({"pp"}) : nullptr;
  const bool sends = mesh.coordinate("tp") == 0;
  const int stage = mesh.coordinate("pp");
  for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
    for (const StagedParameter& p : stages[s]) {
      std::vector<torch::Tensor> tensor(1);
      if (s == stage) {
        if (!p.value.defined()) {
          throw std::invalid_argument("gather_full_state: stage " + std::to_string(s) + " lists " +
                                      p.name + " without this rank's value");
        }
        tensor[0] = gather_tp ? gather_tp(p.name, p.value) : p.value.detach().clone();
      }
      if (s != stage && stage == 0 && sends) {
        tensor[0] = torch::empty(p.full_shape,
                                 p.value.defined() ? p.value.options() : torch::TensorOptions());
        pp_group->recv(tensor, s, 0)->wait();
      }
      if (s == stage && stage != 0 && sends) pp_group->send(tensor, 0, 0)->wait();
      if (stage == 0 && sends) full.insert(p.name, tensor[0].contiguous());
    }
  }
  return full;
}

}  // namespace shardwise::training
