#include "mesh/parallel_layout.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace shardwise::mesh {
namespace {

const char* const kExample = "e.g. [[2, 1], [\"fsdp\", \"tp\"]]";

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

bool known_axis(const std::string& name) {
  try {
    canonical_axis(name);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// One mesh checked and its names made canonical (the MeshSpec rules, in the order a reader
// fixes them: the shape, the sizes, the names).
MeshSpec canonical(const MeshSpec& spec) {
  const std::string shown = mesh_text(spec.sizes, spec.names);
  if (spec.sizes.empty() || spec.sizes.size() != spec.names.size()) {
    fail(spec.key + ": " + shown + " needs one axis name per size, " + kExample);
  }
  for (int size : spec.sizes) {
    if (size < 1) {
      fail(spec.key + ": size " + std::to_string(size) + " in " + shown +
           " must be a positive integer");
    }
  }
  MeshSpec out{spec.key, spec.sizes, {}};
  for (const std::string& name : spec.names) {
    if (!known_axis(name)) {
      fail(spec.key + ": axis name '" + name + "' in " + shown +
           " is not valid; valid: fsdp, dp, tp, pp (or data, replicate, ddp, shard, model, "
           "pipeline)");
    }
    const std::string axis = canonical_axis(name);
    if (std::find(out.names.begin(), out.names.end(), axis) != out.names.end()) {
      fail(spec.key + ": " + shown + " names an axis twice; name each axis once");
    }
    out.names.push_back(axis);
  }
  return out;
}

// The size of `axis` given under `key` (0: not given), against the mesh's axis.
int resolve_size(
    int given, int in_mesh, bool has_mesh, const std::string& axis, const std::string& key) {
  if (given < 0) fail(key + "=" + std::to_string(given) + " must be a positive integer");
  if (given > 0 && has_mesh && in_mesh != given) {
    fail(key + "=" + std::to_string(given) + " but the mesh's '" + axis + "' axis has size " +
         std::to_string(in_mesh) + "; make them equal or drop " + key);
  }
  return given > 0 ? given : in_mesh;
}

// The same axes with the same sizes, in any order.
bool same_axes(const MeshSpec& mesh,
               const std::vector<int>& sizes,
               const std::vector<std::string>& names) {
  if (mesh.names.size() != names.size()) return false;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto it = std::find(mesh.names.begin(), mesh.names.end(), names[i]);
    if (it == mesh.names.end() || mesh.sizes[it - mesh.names.begin()] != sizes[i]) return false;
  }
  return true;
}

}  // namespace

std::string mesh_text(const std::vector<int>& sizes, const std::vector<std::string>& names) {
  std::ostringstream out;
  out << "[[";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << "], [";
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << "'" << names[i] << "'";
  out << "]]";
  return out.str();
}

ParallelLayout::ParallelLayout(const ParallelLayoutOptions& options)
    : world_size_(options.world_size) {
  if (world_size_ < 1) {
    fail(options.keys.world_size + "=" + std::to_string(world_size_) + " must be at least 1");
  }
  for (const MeshSpec& spec : options.meshes) {
    MeshSpec mesh = canonical(spec);
    if (has_mesh() && !same_axes(mesh, mesh_sizes_, mesh_names_)) {
      fail(mesh_key_ + " " + mesh_text(mesh_sizes_, mesh_names_) + " and " + mesh.key + " " +
           mesh_text(mesh.sizes, mesh.names) + " differ; set the mesh in one place");
    }
    mesh_key_ = mesh.key;
    mesh_sizes_ = mesh.sizes;
    mesh_names_ = mesh.names;
  }
  if (!options.meshes.empty()) mesh_key_ = options.meshes.front().key;
  const ParallelLayoutKeys& keys = options.keys;
  tp_ = resolve_size(options.tensor_parallel_size, axis_size("tp"), has_mesh(), "tp",
                     keys.tensor_parallel_size);
  pp_ = resolve_size(options.pipeline_parallel_size, axis_size("pp"), has_mesh(), "pp",
                     keys.pipeline_parallel_size);
  const std::string world = keys.world_size + "=" + std::to_string(world_size_);
  if (tp_ * pp_ > world_size_) {
    fail("rule tensor_parallel * pipeline_parallel <= world_size violated: " + std::to_string(tp_) +
         " × " + std::to_string(pp_) + " = " + std::to_string(tp_ * pp_) + " > " + world +
         "; lower " + keys.tensor_parallel_size + " or " + keys.pipeline_parallel_size +
         ", or launch more processes");
  }
  if (world_size_ % (tp_ * pp_) != 0) {
    fail(world + " is not a multiple of tensor × pipeline parallel = " + std::to_string(tp_ * pp_) +
         "; the data-parallel size must be whole");
  }
  long long product = 1;
  for (int size : mesh_sizes_) product *= size;
  if (has_mesh() && product != world_size_) {
    fail(mesh_key_ + ": " + mesh_text(mesh_sizes_, mesh_names_) + " has " +
         std::to_string(product) + " ranks but " + world +
         "; make the product of the sizes equal the world size");
  }
}

int ParallelLayout::axis_size(const std::string& axis) const {
  const std::string name = canonical_axis(axis);
  for (size_t i = 0; i < mesh_names_.size(); ++i) {
    if (mesh_names_[i] == name) return mesh_sizes_[i];
  }
  return 1;
}

std::string ParallelLayout::data_axis(const std::string& strategy) const {
  if (strategy == "fsdp" || (strategy == "pipeline" && axis_size("fsdp") > 1)) return "fsdp";
  return "dp";
}

MeshLayout ParallelLayout::layout(const std::string& data_kind) const {
  const std::string kind = canonical_axis(data_kind);
  if (kind != "dp" && kind != "fsdp") {
    fail("ParallelLayout::layout: the data axis is dp or fsdp, not '" + data_kind + "'");
  }
  if (axis_size("dp") > 1 && axis_size("fsdp") > 1) {  // a hybrid mesh keeps both data axes
    return MeshLayout(mesh_sizes_, mesh_names_, world_size_);
  }
  return MeshLayout({pp_, data_parallel_size(), tp_}, {"pp", kind, "tp"}, world_size_);
}

}  // namespace shardwise::mesh
