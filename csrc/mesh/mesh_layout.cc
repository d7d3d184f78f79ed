#include "mesh/mesh_layout.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>

namespace shardwise::mesh {
namespace {

int axis_index(const std::string& name) {
  const auto& order = axis_order();
  const auto it = std::find(order.begin(), order.end(), canonical_axis(name));
  return static_cast<int>(it - order.begin());
}

std::string join(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

}  // namespace

std::string canonical_axis(const std::string& name) {
  static const std::map<std::string, std::string> aliases{
      {"pp", "pp"},
      {"dp", "dp"},
      {"fsdp", "fsdp"},
      {"tp", "tp"},
      {"data", "dp"},
      {"pipeline", "pp"},
      {"model", "tp"},
      // torch's HSDP mesh names and Accelerate's: the replicated and the sharded data axes
      {"replicate", "dp"},
      {"ddp", "dp"},
      {"shard", "fsdp"},
  };
  const auto it = aliases.find(name);
  if (it == aliases.end()) {
    throw std::invalid_argument("mesh axis name '" + name +
                                "' is not valid; valid: pp, dp, fsdp, tp (or the aliases "
                                "pipeline, data, replicate, ddp, shard, model)");
  }
  return it->second;
}

MeshLayout::MeshLayout(const std::vector<int>& sizes,
                       const std::vector<std::string>& names,
                       int world_size)
    : sizes_(axis_order().size(), 1), world_size_(world_size) {
  if (sizes.size() != names.size()) {
    throw std::invalid_argument("mesh: " + std::to_string(sizes.size()) + " sizes but " +
                                std::to_string(names.size()) +
                                " axis names; give one name per size, e.g. [[2, 2], [\"fsdp\", "
                                "\"tp\"]]");
  }
  std::vector<bool> seen(sizes_.size(), false);
  long long product = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int axis = axis_index(names[i]);
    if (seen[axis]) {
      throw std::invalid_argument("mesh: axis '" + canonical_axis(names[i]) +
                                  "' is named twice; name each axis once");
    }
    if (sizes[i] < 1) {
      throw std::invalid_argument("mesh: axis '" + names[i] + "' has size " +
                                  std::to_string(sizes[i]) + "; sizes must be >= 1");
    }
    seen[axis] = true;
    sizes_[axis] = sizes[i];
    product *= sizes[i];
  }
  if (product != world_size) {
    throw std::invalid_argument("mesh: the axis sizes multiply to " + std::to_string(product) +
                                " ranks but the world has " + std::to_string(world_size) +
                                "; make the product of the sizes equal the world size");
  }
}

int MeshLayout::size(const std::string& axis) const { return sizes_[axis_index(axis)]; }

int MeshLayout::stride(const std::string& axis) const {
  int stride = 1;
  for (int a = static_cast<int>(sizes_.size()) - 1; a > axis_index(axis); --a) stride *= sizes_[a];
  return stride;
}

int MeshLayout::coordinate(int rank, const std::string& axis) const {
  if (rank < 0 || rank >= world_size_) {
    throw std::invalid_argument("mesh: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(world_size_) + ")");
  }
  return rank / stride(axis) % size(axis);
}

bool MeshLayout::is_writer(int rank, const std::vector<std::string>& replicated_over) const {
  for (const auto& axis : replicated_over) {
    if (coordinate(rank, axis) != 0) return false;
  }
  return true;
}

std::vector<int> MeshLayout::group_of(int rank, const std::vector<std::string>& axes) const {
  // Clear the coordinates along `axes`, then enumerate them in mixed radix (outer axis first).
  int base = rank;
  for (const auto& axis : axes) base -= coordinate(rank, axis) * stride(axis);
  std::vector<std::string> ordered;
  for (const auto& name : axis_order()) {
    for (const auto& axis : axes) {
      if (canonical_axis(axis) == name) ordered.push_back(name);
    }
  }
  std::vector<int> ranks{base};
  for (const auto& axis : ordered) {
    std::vector<int> next;
    for (int r : ranks) {
      for (int i = 0; i < size(axis); ++i) next.push_back(r + i * stride(axis));
    }
    ranks = std::move(next);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::groups(const std::vector<std::string>& axes) const {
  std::vector<std::vector<int>> out;
  std::vector<bool> listed(world_size_, false);
  for (int rank = 0; rank < world_size_; ++rank) {
    if (listed[rank]) continue;
    out.push_back(group_of(rank, axes));
    for (int r : out.back()) listed[r] = true;
  }
  return out;
}

std::string MeshLayout::describe() const {
  std::ostringstream out;
  bool first = true;
  for (size_t a = 0; a < sizes_.size(); ++a) {
    if (sizes_[a] == 1) continue;
    out << (first ? "" : " x ") << axis_order()[a] << "=" << sizes_[a];
    first = false;
  }
  if (first) out << "a single rank";
  out << " (" << world_size_ << " ranks; tp innermost, pp outermost)";
  for (size_t a = 0; a < sizes_.size(); ++a) {
    if (sizes_[a] == 1) continue;
    out << "\n  " << axis_order()[a] << " groups:";
    for (const auto& group : groups({axis_order()[a]})) out << " " << join(group);
  }
  return out.str();
}

}  // namespace shardwise::mesh
