#include "distributed/device_mesh.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace shardwise::distributed {

DeviceMesh::DeviceMesh(World world,
                       const std::vector<int>& sizes,
                       const std::vector<std::string>& names,
                       ProcessGroupOptions options)
    : world_(std::move(world)),
      layout_(sizes, names, world_.size()),
      options_(std::move(options)) {}

DeviceMesh::DeviceMesh(World world, mesh::MeshLayout layout, ProcessGroupOptions options)
    : world_(std::move(world)), layout_(std::move(layout)), options_(std::move(options)) {
  if (layout_.world_size() != world_.size()) {
    throw std::invalid_argument("DeviceMesh: the layout covers " +
                                std::to_string(layout_.world_size()) + " ranks but the world has " +
                                std::to_string(world_.size()) +
                                "; resolve the layout for this world size");
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> DeviceMesh::group(const std::vector<std::string>& axes) {
  const std::vector<int> ranks = layout_.group_of(rank(), axes);
  if (static_cast<int>(ranks.size()) == world_.size()) return world_.group;
  // The key names the axes and the group's first rank: unique per group, equal on its members.
  std::string key = "mesh";
  for (const auto& axis : axes) key += "_" + mesh::canonical_axis(axis);
  key += "/" + std::to_string(ranks.front());
  auto found = groups_.find(key);
  if (found != groups_.end()) return found->second;
  auto created = new_group(world_.store, ranks, rank(), key, options_);
  groups_.emplace(key, created);
  return created;
}

}  // namespace shardwise::distributed
