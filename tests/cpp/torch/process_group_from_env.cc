// Run as real processes by launch_ranks.sh (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, rank
// 0 serving the TCPStore): the world group from init_from_env and a 2 x 2 DeviceMesh's groups
// reduce over the right ranks. Catches a store or group keyed wrongly (ranks joining the wrong
// group hang or sum the wrong values) and a mesh whose groups disagree with MeshLayout.
// Exits 0 on success; prints what differed and exits 1 otherwise.
#include <ATen/ATen.h>
#include <shardwise/shardwise.h>

#include <cstdio>
#include <vector>

namespace {

double allreduce_sum(c10d::ProcessGroup& group, double value) {
  std::vector<at::Tensor> tensors{at::full({3}, value, at::kDouble)};
  group.allreduce(tensors)->wait();
  return tensors[0][2].item<double>();
}

int expect(bool ok, int rank, const char* what, double got, double want) {
  if (ok) return 0;
  std::fprintf(stderr, "rank %d: %s = %g, expected %g\n", rank, what, got, want);
  return 1;
}

}  // namespace

int main() {
  auto world = shardwise::distributed::init_from_env();
  const int rank = world.rank(), size = world.size();
  int failures = 0;
  const double total = allreduce_sum(*world.group, rank + 1);
  failures +=
      expect(total == size * (size + 1) / 2.0, rank, "world sum", total, size * (size + 1) / 2.0);
  if (size == 4) {
    shardwise::distributed::DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    // tp groups are adjacent ranks {0,1}, {2,3}; dp groups {0,2}, {1,3}.
    const double tp = allreduce_sum(*mesh.group({"tp"}), rank);
    const int tp_first = rank - rank % 2;
    failures += expect(tp == 2 * tp_first + 1, rank, "tp sum", tp, 2 * tp_first + 1);
    const double dp = allreduce_sum(*mesh.group({"dp"}), rank);
    failures += expect(dp == 2 * (rank % 2) + 2, rank, "dp sum", dp, 2 * (rank % 2) + 2);
    const double both = allreduce_sum(*mesh.group({"dp", "tp"}), 1.0);
    failures += expect(both == 4, rank, "dp x tp sum", both, 4);
    failures += expect(mesh.group({"tp"}).get() == mesh.group({"model"}).get(), rank,
                       "cached group reused", 0, 1);
  }
  world.group->barrier()->wait();
  if (failures == 0 && rank == 0) std::printf("process groups from the environment: ok\n");
  return failures == 0 ? 0 : 1;
}
