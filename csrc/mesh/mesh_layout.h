// An N-D device mesh: which ranks form the group of each axis. Axes are laid out in one fixed
// order, outermost first: pp, dp, fsdp, tp. So tensor-parallel ranks are adjacent (one host),
// the pipeline is outermost (Megatron's and torchtitan's layout), and a hybrid [[r, s], ["dp",
// "fsdp"]] shards within runs of s adjacent ranks and replicates across them. A rank's
// coordinates are its digits in that mixed radix: rank = ((pp * dp + d) * fsdp + f) * tp + t.
// Torch-free: the ATen/Python side makes one process group per group listed here.
#pragma once

#include <string>
#include <vector>

namespace shardwise::mesh {

// Canonical axis names, outermost first. Aliases accepted on input: data -> dp,
// pipeline -> pp, model -> tp (the distributed config's mesh_axis_names).
inline const std::vector<std::string>& axis_order() {
  static const std::vector<std::string> order{"pp", "dp", "fsdp", "tp"};
  return order;
}

// The canonical name of `name` ("data" -> "dp"), or throws std::invalid_argument naming the
// valid names.
std::string canonical_axis(const std::string& name);

class MeshLayout {
 public:
  // `sizes[i]` ranks along axis `names[i]` (any order, any alias; axes left out have size 1).
  // Throws std::invalid_argument when a size is < 1, a name is unknown or repeated, the lists
  // differ in length, or the product of the sizes is not `world_size`.
  MeshLayout(const std::vector<int>& sizes, const std::vector<std::string>& names, int world_size);

  int world_size() const { return world_size_; }
  int size(const std::string& axis) const;  // 1 for an axis not in the mesh
  // Rank `rank`'s index along `axis`.
  int coordinate(int rank, const std::string& axis) const;
  // Every group along `axes` (one or more axes, flattened; e.g. {"dp", "fsdp"} is the whole data
  // dimension): the ranks that differ only in those coordinates, in ascending order. Groups are
  // listed by the smallest rank they hold, so every rank builds them in the same order.
  std::vector<std::vector<int>> groups(const std::vector<std::string>& axes) const;
  // The group along `axes` that holds `rank`.
  std::vector<int> group_of(int rank, const std::vector<std::string>& axes) const;
  // Whether `rank` writes a tensor that every rank along `replicated_over` holds alike: the one
  // at coordinate 0 of each of those axes does (training/checkpoint_writer.h names the axes).
  bool is_writer(int rank, const std::vector<std::string>& replicated_over) const;
  // The axes of size > 1 with their sizes, e.g. "fsdp=2 x tp=2", then each axis's groups.
  std::string describe() const;

 private:
  int stride(const std::string& axis) const;  // rank distance between neighbours along `axis`
  std::vector<int> sizes_;                    // per axis_order()
  int world_size_;
};

}  // namespace shardwise::mesh
