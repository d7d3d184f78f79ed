// MeshLayout: the rank groups of 1-, 2- and 3-D meshes against Megatron's documented layout
// (tp adjacent, pp outermost), aliases, flattened data groups, and the errors for bad meshes;
// tp_shapes' shard ranges and divisibility errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "mesh/mesh_layout.h"
#include "tensor_parallel/tp_shapes.h"

namespace shardwise::mesh {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(MeshLayout, FsdpByTpPutsTpRanksNextToEachOther) {
  MeshLayout mesh({2, 2}, {"fsdp", "tp"}, 4);
  EXPECT_EQ(mesh.groups({"tp"}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.groups({"fsdp"}), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.coordinate(3, "tp"), 1);
  EXPECT_EQ(mesh.coordinate(2, "fsdp"), 1);
  EXPECT_EQ(mesh.size("pp"), 1);
}

TEST(MeshLayout, NamesInAnyOrderGiveTheSameLayout) {
  MeshLayout a({2, 4}, {"tp", "dp"}, 8), b({4, 2}, {"dp", "tp"}, 8);
  for (const char* axis : {"tp", "dp"}) EXPECT_EQ(a.groups({axis}), b.groups({axis}));
}

TEST(MeshLayout, MegatronDocstringExampleTp2Pp4) {
  // parallel_state.py: 16 GPUs, TP=2, PP=4 -> TP [0,1],[2,3]..., DP [0,2],[1,3],...,
  // PP [0,4,8,12],[1,5,9,13],...
  MeshLayout mesh({2, 4, 2}, {"dp", "pp", "tp"}, 16);
  const Groups tp = mesh.groups({"tp"});
  EXPECT_EQ(tp.front(), (std::vector<int>{0, 1}));
  EXPECT_EQ(tp[1], (std::vector<int>{2, 3}));
  const Groups dp = mesh.groups({"dp"});
  EXPECT_EQ(dp.front(), (std::vector<int>{0, 2}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3}));
  const Groups pp = mesh.groups({"pp"});
  EXPECT_EQ(pp.front(), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(pp[1], (std::vector<int>{1, 5, 9, 13}));
}

TEST(MeshLayout, EveryAxisPartitionsTheWorld) {
  MeshLayout mesh({2, 3, 2, 2}, {"pp", "dp", "fsdp", "tp"}, 24);
  for (const auto& axes : std::vector<std::vector<std::string>>{
           {"pp"}, {"dp"}, {"fsdp"}, {"tp"}, {"dp", "fsdp"}, {"pp", "tp"}}) {
    std::set<int> seen;
    size_t expected = 1;
    for (const auto& a : axes) expected *= mesh.size(a);
    for (const auto& group : mesh.groups(axes)) {
      EXPECT_EQ(group.size(), expected);
      for (int r : group) {
        EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " in two groups";
        EXPECT_EQ(mesh.group_of(r, axes), group);
        for (const auto& other : {"pp", "dp", "fsdp", "tp"}) {  // only `axes` vary in a group
          if (std::find(axes.begin(), axes.end(), other) != axes.end()) continue;
          EXPECT_EQ(mesh.coordinate(r, other), mesh.coordinate(group[0], other));
        }
      }
    }
    EXPECT_EQ(seen.size(), 24u);
  }
}

TEST(MeshLayout, HybridShardsWithinAdjacentRanks) {
  MeshLayout mesh({2, 2}, {"dp", "fsdp"}, 4);  // 2 replicas of 2 shards
  EXPECT_EQ(mesh.groups({"fsdp"}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.groups({"dp"}), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.groups({"dp", "fsdp"}), (Groups{{0, 1, 2, 3}}));
}

TEST(MeshLayout, SeedOneAliases) {
  MeshLayout mesh({2, 2, 2}, {"data", "pipeline", "model"}, 8);
  EXPECT_EQ(mesh.size("tp"), 2);
  EXPECT_EQ(mesh.size("pp"), 2);
  EXPECT_EQ(mesh.groups({"model"}), mesh.groups({"tp"}));
  EXPECT_EQ(canonical_axis("data"), "dp");
}

TEST(MeshLayout, DescribeListsGroups) {
  MeshLayout mesh({2, 2}, {"fsdp", "tp"}, 4);
  const std::string text = mesh.describe();
  EXPECT_NE(text.find("fsdp=2 x tp=2"), std::string::npos) << text;
  EXPECT_NE(text.find("tp groups: [0, 1] [2, 3]"), std::string::npos) << text;
  EXPECT_NE(text.find("fsdp groups: [0, 2] [1, 3]"), std::string::npos) << text;
}

void expect_error(const std::function<void()>& fn, const std::string& words) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << words << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(MeshLayout, BadMeshesAreRefusedWithTheFix) {
  expect_error([] { MeshLayout({2, 2}, {"fsdp", "tp"}, 8); },
               "multiply to 4 ranks but the world has 8");
  expect_error([] { MeshLayout({2, 2}, {"fsdp", "tensor"}, 4); }, "'tensor' is not valid");
  expect_error([] { MeshLayout({2, 2}, {"dp", "data"}, 4); }, "named twice");
  expect_error([] { MeshLayout({0, 4}, {"dp", "tp"}, 4); }, "sizes must be >= 1");
  expect_error([] { MeshLayout({4}, {"dp", "tp"}, 4); }, "1 sizes but 2 axis names");
}

}  // namespace
}  // namespace shardwise::mesh

namespace shardwise::tensor_parallel {
namespace {

TEST(TpShapes, ShardRangesTileTheDimension) {
  for (int tp : {1, 2, 4, 8}) {
    int64_t next = 0;
    for (int r = 0; r < tp; ++r) {
      const ShardRange range = shard_range(64, r, tp, "m", "out_features");
      EXPECT_EQ(range.start, next);
      EXPECT_EQ(range.size, 64 / tp);
      next += range.size;
    }
    EXPECT_EQ(next, 64);
  }
}

TEST(TpShapes, IndivisibleDimensionNamesModuleDimensionAndFix) {
  try {
    check_divisible(6, 4, "blocks.0.up", "out_features");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("blocks.0.up"), std::string::npos) << what;
    EXPECT_NE(what.find("out_features = 6"), std::string::npos) << what;
    EXPECT_NE(what.find("choose a tp size that divides 6"), std::string::npos) << what;
  }
}

// shard_runs against an explicit cut: every element of each rank's shard (as shard_tensor cuts
// it: per fused part, the rank's slice along dim) is found at its full index.
TEST(TpShapes, ShardRunsLocateEveryElement) {
  const std::vector<std::vector<int64_t>> shapes{{12, 4}, {6, 8}, {12}, {2, 6, 4}};
  for (const auto& shape : shapes) {
    for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
      for (int64_t chunks : {1, 3}) {
        if (shape[dim] % (2 * chunks) != 0) continue;
        int64_t inner = 1, outer = 1;
        for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
        for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
        const int64_t part = shape[dim] / chunks, slice = part / 2;
        for (int rank = 0; rank < 2; ++rank) {
          std::vector<int64_t> expected;  // full indices of the shard, in shard order
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t c = 0; c < chunks; ++c)
              for (int64_t i = 0; i < slice; ++i)
                for (int64_t j = 0; j < inner; ++j)
                  expected.push_back((o * shape[dim] + c * part + rank * slice + i) * inner + j);
          std::vector<int64_t> got(expected.size(), -1);
          for (const ShardRun& run : shard_runs(shape, dim, chunks, rank, 2)) {
            for (int64_t k = 0; k < run.length; ++k)
              got.at(run.local_start + k) = run.full_start + k;
          }
          EXPECT_EQ(got, expected) << "dim " << dim << " chunks " << chunks << " rank " << rank;
        }
      }
    }
  }
  EXPECT_EQ(shard_runs({8, 4}, 0, 1, 1, 2).size(), 1u);  // a row block is one run
}

}  // namespace
}  // namespace shardwise::tensor_parallel
