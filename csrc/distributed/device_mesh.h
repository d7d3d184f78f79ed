// An N-D device mesh over a World: the process group of each axis (or of several axes
// flattened, e.g. {"dp", "fsdp"}) that holds this rank, created on first use. The layout (which
// ranks form each group, tp innermost) is mesh/mesh_layout.h's, the one the Python trainer uses,
// so a C++ and a Python run of the same mesh put the same ranks together.
//
//   shardwise::distributed::DeviceMesh mesh(world, {2, 2}, {"fsdp", "tp"});
//   auto tp = mesh.group({"tp"});
//
// or from a run's resolved layout (mesh/parallel_layout.h), as the trainers do:
//   mesh::ParallelLayout layout({world.size(), {}, /*tp=*/2, /*pp=*/1});
//   shardwise::distributed::DeviceMesh mesh(world, layout.layout("fsdp"));
//
// group() is collective over that group's members: they must ask for the same axes in the same
// order (each group's rendezvous is keyed by its axes and ranks).
#pragma once

#include <map>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "distributed/process_group.h"
#include "mesh/mesh_layout.h"

namespace shardwise::distributed {

class DeviceMesh {
 public:
  // Throws std::invalid_argument (naming `sizes`/`names` and the world size) before any group
  // is created when the mesh does not tile the world.
  DeviceMesh(World world,
             const std::vector<int>& sizes,
             const std::vector<std::string>& names,
             ProcessGroupOptions options = {});
  // The mesh of a layout already resolved (mesh::ParallelLayout::layout(data_kind)), whose world
  // size must be the World's.
  DeviceMesh(World world, mesh::MeshLayout layout, ProcessGroupOptions options = {});

  const mesh::MeshLayout& layout() const { return layout_; }
  int rank() const { return world_.rank(); }
  int size(const std::string& axis) const { return layout_.size(axis); }
  int coordinate(const std::string& axis) const { return layout_.coordinate(rank(), axis); }
  // The group along `axes` holding this rank; the world group when the axes cover the world.
  c10::intrusive_ptr<c10d::ProcessGroup> group(const std::vector<std::string>& axes);

 private:
  World world_;
  mesh::MeshLayout layout_;
  ProcessGroupOptions options_;
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups_;
};

}  // namespace shardwise::distributed
