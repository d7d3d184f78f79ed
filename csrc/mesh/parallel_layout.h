// The run's parallel layout, resolved once from what a config says: the meshes it writes (as
// [[sizes], [names]], under one or more keys, in any axis order and with any alias), the
// tensor- and pipeline-parallel sizes it gives, and the world size. Every mesh rule lives here,
// each error naming the config key and the fix:
//   - a mesh has one known axis name per size, each size >= 1, no axis twice;
//   - two meshes given under two keys are the same mesh (the same axes and sizes);
//   - a tensor_parallel_size / pipeline_parallel_size given beside a mesh equals its axis;
//   - tp × pp <= world_size, and divides it (the data-parallel size is whole);
//   - the mesh's product is the world size.
// The data axis is what is left: data_parallel_size = world / (tp × pp). layout(data_kind) is
// the rank layout every strategy uses (mesh_layout.h: pp outermost, tp innermost), with the data
// axis named as the strategy runs it (dp, fsdp) unless the mesh names its own data axes (a
// hybrid [[r, s], ["dp", "fsdp"]]). Torch-free; the Python config and the C++ trainer read it.
#pragma once

#include <string>
#include <vector>

#include "mesh/mesh_layout.h"

namespace shardwise::mesh {

// One mesh as a config writes it.
struct MeshSpec {
  std::string key;                 // where the config wrote it, e.g. "model.mesh_shape"
  std::vector<int> sizes;          // ranks along each axis
  std::vector<std::string> names;  // dp, fsdp, tp, pp or an alias (mesh_layout.h)
};

// How the caller spells the three sizes, for the errors: the YAML keys of a config, or a command
// line's flags (train_gpt: --world, --tp, --pp).
struct ParallelLayoutKeys {
  std::string world_size = "distributed.world_size";
  std::string tensor_parallel_size = "distributed.tensor_parallel_size";
  std::string pipeline_parallel_size = "distributed.pipeline_parallel_size";
};

struct ParallelLayoutOptions {
  int world_size = 1;
  std::vector<MeshSpec> meshes;    // every mesh the config gives (more than one must agree)
  int tensor_parallel_size = 0;    // 0: not given (the mesh's tp axis, else 1)
  int pipeline_parallel_size = 0;  // 0: not given (the mesh's pp axis, else 1)
  ParallelLayoutKeys keys;
};

class ParallelLayout {
 public:
  // Checks every rule above; throws std::invalid_argument naming the key and the fix.
  explicit ParallelLayout(const ParallelLayoutOptions& options);

  int world_size() const { return world_size_; }
  bool has_mesh() const { return !mesh_key_.empty(); }
  const std::string& mesh_key() const { return mesh_key_; }  // "" without a mesh
  // The mesh as given, with canonical axis names, in the order written.
  const std::vector<int>& mesh_sizes() const { return mesh_sizes_; }
  const std::vector<std::string>& mesh_names() const { return mesh_names_; }
  // The given mesh's size along `axis` (any alias); 1 when the mesh lacks it or there is none.
  int axis_size(const std::string& axis) const;
  int tensor_parallel_size() const { return tp_; }
  int pipeline_parallel_size() const { return pp_; }
  int data_parallel_size() const { return world_size_ / (tp_ * pp_); }
  // The data axis `strategy` (ddp, fsdp, zero, pipeline) runs over: fsdp for FSDP, and for a
  // pipeline whose mesh names an fsdp axis > 1 (its stages FSDP-sharded); dp otherwise.
  std::string data_axis(const std::string& strategy) const;
  // The rank layout for a strategy whose data axis is `data_kind` (dp or fsdp).
  MeshLayout layout(const std::string& data_kind) const;

 private:
  int world_size_;
  std::string mesh_key_;
  std::vector<int> mesh_sizes_;
  std::vector<std::string> mesh_names_;
  int tp_ = 1, pp_ = 1;
};

// A mesh written as a config shows it: [[2, 1], ['fsdp', 'tp']].
std::string mesh_text(const std::vector<int>& sizes, const std::vector<std::string>& names);

}  // namespace shardwise::mesh
