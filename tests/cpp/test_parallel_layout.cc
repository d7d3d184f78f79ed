// ParallelLayout: a sweep over world 1-8 x every (pp, tp) that divides it x both data kinds x
// every order a config may write the mesh in (and the same sizes given without a mesh): one
// layout comes out, pp outermost and tp innermost, every rank in exactly one group of each axis.
// Then each rule's error, naming the key and the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "mesh/parallel_layout.h"

namespace shardwise::mesh {
namespace {

struct Case {
  int world, pp, tp;
  std::string kind;  // the data axis: dp or fsdp
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int world = 1; world <= 8; ++world) {
    for (int pp = 1; pp <= world; ++pp) {
      for (int tp = 1; pp * tp <= world; ++tp) {
        if (world % (pp * tp) != 0) continue;
        for (const char* kind : {"dp", "fsdp"}) cases.push_back({world, pp, tp, kind});
      }
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "world" + std::to_string(c.world) + "_pp" + std::to_string(c.pp) + "_tp" +
         std::to_string(c.tp) + "_" + c.kind;
}

class Layouts : public ::testing::TestWithParam<Case> {};

// The mesh written in every order of its three axes, under model.mesh_shape.
std::vector<MeshSpec> every_order(const Case& c) {
  std::vector<std::pair<std::string, int>> axes{
      {"pp", c.pp}, {c.kind, c.world / (c.pp * c.tp)}, {"tp", c.tp}};
  std::sort(axes.begin(), axes.end());
  std::vector<MeshSpec> out;
  do {
    MeshSpec spec{"model.mesh_shape", {}, {}};
    for (const auto& [name, size] : axes) {
      spec.sizes.push_back(size);
      spec.names.push_back(name);
    }
    out.push_back(spec);
  } while (std::next_permutation(axes.begin(), axes.end()));
  return out;
}

TEST_P(Layouts, EveryOrderAndTheBareSizesGiveOneLayoutPpOutermostTpInnermost) {
  const Case c = GetParam();
  const int data = c.world / (c.pp * c.tp);
  ParallelLayoutOptions bare;
  bare.world_size = c.world;
  bare.tensor_parallel_size = c.tp;
  bare.pipeline_parallel_size = c.pp;
  const MeshLayout expected = ParallelLayout(bare).layout(c.kind);
  for (const MeshSpec& spec : every_order(c)) {
    ParallelLayoutOptions options;
    options.world_size = c.world;
    options.meshes = {spec};
    const ParallelLayout layout(options);
    EXPECT_EQ(layout.tensor_parallel_size(), c.tp);
    EXPECT_EQ(layout.pipeline_parallel_size(), c.pp);
    EXPECT_EQ(layout.data_parallel_size(), data);
    const MeshLayout mesh = layout.layout(c.kind);
    EXPECT_EQ(mesh.describe(), expected.describe());
    for (const char* axis : {"pp", "tp"}) EXPECT_EQ(mesh.groups({axis}), expected.groups({axis}));
    EXPECT_EQ(mesh.groups({c.kind}), expected.groups({c.kind}));
  }
  for (const std::string axis : {std::string("pp"), c.kind, std::string("tp")}) {
    std::set<int> seen;  // each rank in exactly one group of the axis
    for (const auto& group : expected.groups({axis})) {
      EXPECT_EQ(static_cast<int>(group.size()), expected.size(axis));
      for (int r : group) EXPECT_TRUE(seen.insert(r).second) << axis << " rank " << r;
    }
    EXPECT_EQ(static_cast<int>(seen.size()), c.world);
  }
  for (int rank = 0; rank < c.world; ++rank) {
    EXPECT_EQ(expected.coordinate(rank, "tp"), rank % c.tp);           // innermost
    EXPECT_EQ(expected.coordinate(rank, "pp"), rank / (data * c.tp));  // outermost
    EXPECT_EQ(expected.coordinate(rank, c.kind), rank / c.tp % data);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, Layouts, ::testing::ValuesIn(all_cases()), case_name);

std::string error_of(const ParallelLayoutOptions& options) {
  try {
    ParallelLayout layout(options);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

ParallelLayoutOptions with_mesh(int world, std::vector<int> sizes, std::vector<std::string> names) {
  ParallelLayoutOptions options;
  options.world_size = world;
  options.meshes = {{"model.mesh_shape", std::move(sizes), std::move(names)}};
  return options;
}

TEST(ParallelLayout, AliasesAreTheAxesTheyName) {
  const ParallelLayout layout(with_mesh(8, {2, 2, 2}, {"data", "pipeline", "model"}));
  EXPECT_EQ(layout.mesh_names(), (std::vector<std::string>{"dp", "pp", "tp"}));
  EXPECT_EQ(layout.tensor_parallel_size(), 2);
  EXPECT_EQ(layout.pipeline_parallel_size(), 2);
  // torch's HSDP mesh names, and Accelerate's "ddp"
  const ParallelLayout hsdp(with_mesh(4, {2, 2}, {"replicate", "shard"}));
  EXPECT_EQ(hsdp.mesh_names(), (std::vector<std::string>{"dp", "fsdp"}));
  EXPECT_EQ(ParallelLayout(with_mesh(2, {2}, {"ddp"})).axis_size("dp"), 2);
}

// A command line names its own flags: train_gpt's --tp and --pp, not the YAML keys.
TEST(ParallelLayout, ErrorsNameTheCallersKeys) {
  ParallelLayoutOptions flags;
  flags.world_size = 1;
  flags.tensor_parallel_size = 2;
  flags.keys = {"WORLD_SIZE", "--tp", "--pp"};
  EXPECT_NE(error_of(flags).find("2 × 1 = 2 > WORLD_SIZE=1; lower --tp or --pp, or launch more"),
            std::string::npos)
      << error_of(flags);
  flags.world_size = 3;
  EXPECT_NE(error_of(flags).find("WORLD_SIZE=3 is not a multiple"), std::string::npos);
}

TEST(ParallelLayout, TheDataAxisIsTheStrategysOrThePipelineMeshs) {
  const ParallelLayout fsdp_pp(with_mesh(4, {2, 2}, {"fsdp", "pp"}));
  EXPECT_EQ(fsdp_pp.data_axis("pipeline"), "fsdp");
  EXPECT_EQ(ParallelLayout(with_mesh(4, {2, 2}, {"dp", "pp"})).data_axis("pipeline"), "dp");
  EXPECT_EQ(fsdp_pp.data_axis("fsdp"), "fsdp");
  EXPECT_EQ(fsdp_pp.data_axis("zero"), "dp");
  EXPECT_EQ(fsdp_pp.data_axis("ddp"), "dp");
}

TEST(ParallelLayout, AHybridMeshKeepsBothDataAxes) {
  const MeshLayout mesh = ParallelLayout(with_mesh(4, {2, 2}, {"dp", "fsdp"})).layout("fsdp");
  EXPECT_EQ(mesh.size("dp"), 2);
  EXPECT_EQ(mesh.size("fsdp"), 2);
  EXPECT_EQ(mesh.groups({"fsdp"}), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
}

TEST(ParallelLayout, EachRuleNamesTheKeyAndTheFix) {
  EXPECT_NE(error_of(with_mesh(2, {2}, {"tensor"}))
                .find("model.mesh_shape: axis name 'tensor' in [[2], ['tensor']] is not valid; "
                      "valid: fsdp, dp, tp, pp"),
            std::string::npos);
  EXPECT_NE(error_of(with_mesh(2, {2, 1}, {"fsdp"})).find("needs one axis name per size"),
            std::string::npos);
  EXPECT_NE(error_of(with_mesh(2, {2, 0}, {"fsdp", "tp"})).find("size 0 in"), std::string::npos);
  EXPECT_NE(error_of(with_mesh(4, {2, 2}, {"dp", "data"})).find("names an axis twice"),
            std::string::npos);
  EXPECT_NE(error_of(with_mesh(4, {2, 1}, {"fsdp", "tp"}))
                .find("has 2 ranks but distributed.world_size=4; make the product of the sizes "
                      "equal the world size"),
            std::string::npos);
  ParallelLayoutOptions two = with_mesh(2, {2, 1}, {"fsdp", "tp"});
  two.meshes.push_back({"distributed.mesh_shape", {2, 1}, {"dp", "tp"}});
  const std::string differ = error_of(two);
  EXPECT_NE(differ.find("model.mesh_shape [[2, 1], ['fsdp', 'tp']] and distributed.mesh_shape"),
            std::string::npos)
      << differ;
  two.meshes.back() = {"distributed.mesh_shape", {1, 2}, {"tp", "fsdp"}};
  EXPECT_EQ(error_of(two), "no error");  // the same axes in another order: one mesh
  ParallelLayoutOptions sizes = with_mesh(4, {2, 2}, {"dp", "tp"});
  sizes.tensor_parallel_size = 4;
  EXPECT_NE(error_of(sizes).find("distributed.tensor_parallel_size=4 but the mesh's 'tp' axis "
                                 "has size 2; make them equal or drop"),
            std::string::npos);
  ParallelLayoutOptions big;
  big.world_size = 2;
  big.tensor_parallel_size = 2;
  big.pipeline_parallel_size = 2;
  EXPECT_NE(error_of(big).find("2 × 2 = 4 > distributed.world_size=2"), std::string::npos);
  big.world_size = 6;
  big.pipeline_parallel_size = 4;
  big.tensor_parallel_size = 1;
  EXPECT_NE(error_of(big).find("is not a multiple of tensor × pipeline parallel = 4"),
            std::string::npos);
}

}  // namespace
}  // namespace shardwise::mesh
