// The writer rule of checkpoint_writer.h.
#include "training/checkpoint_writer.h"

namespace shardwise::training {

std::vector<std::string> replicated_axes(const ParameterPlacement& placement) {
  std::vector<std::string> axes{"dp"};
  if (!placement.tp_split) axes.push_back("tp");
  if (placement.tied) axes.push_back("pp");
  return axes;
}

bool writes(const mesh::MeshLayout& layout, int rank, const ParameterPlacement& placement) {
  return layout.is_writer(rank, replicated_axes(placement));
}

}  // namespace shardwise::training
