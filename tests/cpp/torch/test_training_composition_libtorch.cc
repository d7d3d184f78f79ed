// The training rules composed as a LibTorch user composes them (csrc/training), on 8 thread ranks:
// a mesh of pp 2 x dp 2 x tp 2 (ParallelLayout, DeviceMesh), a two-stage model whose MLPs are
// tensor parallel (Megatron's column then row split) with a weight tied across the stages, run by
// pipeline::Pipeline under 1F1B with its replicas data parallel; the mesh-wide clip, the warm-up /
// cosine learning rate, then the full state gathered to rank 0 and the checkpoint pieces written
// by the writer rule. On dp 2 x tp 2, the same tensor-parallel MLPs train alone (their gradients
// averaged over dp), and ZeRO-2 runs over the data axis of them; on fsdp 2 x tp 2,
// FullyShardedDataParallel runs over a module whose parameters are those tp shards (each MLP its
// own unit), clipped over the mesh. Each is compared with the unsharded model trained on the whole
// batch in one thread with torch's own clip and AdamW.
//
// Catches: a tie counted twice (or its copy left unscaled) in the clip, split gradients not summed
// over tp (or replicated ones summed), FSDP shards of tp shards not summed over the data axis, the
// data replicas' gradients not averaged, the full state missing a stage's or a shard's part, and a
// checkpoint whose pieces miss or repeat an element.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/average_gradients.h"
#include "distributed/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "mesh/parallel_layout.h"
#include "pipeline/pipeline.h"
#include "sharding/checkpoint_pieces.h"
#include "tensor_parallel/parallel_linear.h"
#include "tensor_parallel/sharded_parameters.h"
#include "thread_group.h"
#include "training/checkpoint_hooks.h"
#include "training/full_state.h"
#include "training/lr_schedule.h"
#include "training/mesh_clip.h"
#include "training/stage_cut.h"
#include "zero/zero_redundancy_optimizer.h"

namespace {

namespace sw = shardwise;
using Params = std::map<std::string, torch::Tensor>;

constexpr int64_t kDim = 8, kHidden = 16, kBatch = 8, kSteps = 3;
constexpr double kMaxNorm = 0.05;  // small enough that every step clips

const sw::training::WarmupCosineOptions kSchedule{1e-2, 1, kSteps, 0.1};

// How each MLP parameter is split over tp (the rest replicated): Megatron's column then row split.
const sw::tensor_parallel::SplitRule split_rule = sw::tensor_parallel::split_by_suffix(
    {{"up.weight", {0}}, {"up.bias", {0}}, {"down.weight", {1}}});

const Params& initial_model();

// A copy of the initial weights.
Params full_model() {
  Params out;
  for (const auto& [name, t] : initial_model()) out[name] = t.clone();
  return out;
}

// x + down(gelu(up(x))), tensor parallel when `tp` is given (`p`: Params or ShardedParameters).
template <typename P>
torch::Tensor mlp(const torch::Tensor& x,
                  const P& p,
                  const std::string& s,
                  const sw::tensor_parallel::Group& tp) {
  if (!tp) {
    auto h = torch::gelu(torch::linear(x, p.at(s + "up.weight"), p.at(s + "up.bias")));
    return x + torch::linear(h, p.at(s + "down.weight"), p.at(s + "down.bias"));
  }
  sw::tensor_parallel::ParallelOptions o;
  o.group = tp;
  auto h = torch::gelu(sw::tensor_parallel::column_parallel_linear(x, p.at(s + "up.weight"),
                                                                   p.at(s + "up.bias"), o));
  return x + sw::tensor_parallel::row_parallel_linear(h, p.at(s + "down.weight"),
                                                      p.at(s + "down.bias"), o);
}

struct Data {
  torch::Tensor x, y;
};
// Step `step`'s batch (1-based), drawn once before the threads start (the default generator is
// not for concurrent use).
const std::vector<Data>& batches() {
  static const std::vector<Data> all = [] {
    std::vector<Data> out(kSteps + 1);
    torch::manual_seed(100);
    for (auto& d : out) d = {torch::randn({kBatch, kDim}), torch::randn({kBatch, kDim})};
    return out;
  }();
  return all;
}
const Data& batch(int step) { return batches().at(step); }

// The full model's initial weights, drawn once likewise.
const Params& initial_model() {
  static const Params all = [] {
    torch::manual_seed(0);
    Params p{{"tie", torch::randn({kDim, kDim}) * 0.3}};
    for (const std::string s : {"s0.", "s1."}) {
      p[s + "up.weight"] = torch::randn({kHidden, kDim}) * 0.3;
      p[s + "up.bias"] = torch::randn({kHidden}) * 0.1;
      p[s + "down.weight"] = torch::randn({kDim, kHidden}) * 0.3;
      p[s + "down.bias"] = torch::randn({kDim}) * 0.1;
    }
    return p;
  }();
  return all;
}

// The unsharded model's output: with the tie, its input projection and (transposed) its head.
torch::Tensor reference_forward(const Params& p, const torch::Tensor& x) {
  if (!p.count("tie")) return mlp(mlp(x, p, "s0.", {}), p, "s1.", {});
  auto h = mlp(mlp(torch::matmul(x, p.at("tie")), p, "s0.", {}), p, "s1.", {});
  return torch::matmul(h, p.at("tie").t());
}

// The unsharded model on the whole batch: torch's clip and AdamW. Returns the norms per step.
std::vector<double> train_reference(Params& p) {
  std::vector<torch::Tensor> params;
  for (auto& [name, t] : p) params.push_back(t.requires_grad_(true));
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  std::vector<double> norms;
  for (int step = 1; step <= kSteps; ++step) {
    const Data& d = batch(step);
    torch::mse_loss(reference_forward(p, d.x), d.y).backward();
    norms.push_back(torch::nn::utils::clip_grad_norm_(params, kMaxNorm));
    for (auto& group : optimizer.param_groups()) {
      group.options().set_lr(sw::training::warmup_cosine_lr(kSchedule, step));
    }
    optimizer.step();
    optimizer.zero_grad();
  }
  return norms;
}

// Every step's clip norm as the reference's, and the clip acting at each.
void expect_norms(const std::vector<double>& ours, const std::vector<double>& reference) {
  ASSERT_EQ(ours.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_NEAR(ours[i], reference[i], 1e-5 * reference[i]) << "step " << i + 1;
    EXPECT_GT(reference[i], kMaxNorm);  // the clip acted
  }
}

// The gathered full state as the reference's parameters, name for name.
void expect_full_state(const Params& full, const Params& reference) {
  ASSERT_EQ(full.size(), reference.size());
  for (const auto& [name, expected] : reference) {
    EXPECT_TRUE(torch::allclose(full.at(name), expected.detach(), 1e-4, 1e-6)) << name;
  }
}

struct Saved {
  std::mutex mutex;
  std::vector<sw::sharding::TensorSlice> pieces;
  Params full;
  std::vector<double> norms;
};

// Every element of the model written exactly once by the writer rule, and the pieces rebuild the
// gathered tensors.
void expect_pieces(const Saved& saved, const Params& reference) {
  std::map<std::string, int64_t> written;
  for (const auto& piece : saved.pieces) {
    if (piece.name.find(':') == std::string::npos) written[piece.name] += piece.values.numel();
  }
  for (const auto& [name, expected] : reference) {
    EXPECT_EQ(written[name], expected.numel()) << name << ": each element written once";
    torch::Tensor rebuilt = torch::empty({expected.numel()});
    sw::sharding::fill_from_pieces({{name, 0, rebuilt}}, saved.pieces, /*strict=*/true);
    EXPECT_TRUE(torch::equal(rebuilt.view(expected.sizes()), saved.full.at(name))) << name;
  }
}

sw::distributed::World thread_world(int rank,
                                    int world,
                                    const c10::intrusive_ptr<c10d::Store>& store) {
  sw::distributed::World w;
  w.env.rank = rank;
  w.env.world_size = world;
  w.store = store;
  w.group = make_thread_group(store, rank, world, "world");
  return w;
}

// The model as pipeline blocks over this rank's tp shards: the tie's input projection, the two
// MLPs, and the head (the last stage's own copy of the tie, "tie_copy").
std::vector<sw::pipeline::PipelineBlock> model_blocks(
    const std::shared_ptr<const sw::tensor_parallel::ShardedParameters>& mine,
    const sw::tensor_parallel::Group& tp) {
  return {
      {[mine](const torch::Tensor& x) { return torch::matmul(x, mine->at("tie")); },
       {{"tie", mine->at("tie")}}},
      {[mine, tp](const torch::Tensor& x) { return mlp(x, *mine, "s0.", tp); }, mine->named("s0.")},
      {[mine, tp](const torch::Tensor& x) { return mlp(x, *mine, "s1.", tp); }, mine->named("s1.")},
      {[mine](const torch::Tensor& x) { return torch::matmul(x, mine->at("tie_copy").t()); },
       {{"tie_copy", mine->at("tie_copy")}}}};
}

void pipeline_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store, Saved& saved) {
  auto world = thread_world(rank, 8, store);
  sw::mesh::ParallelLayout layout({8, {}, /*tp=*/2, /*pp=*/2});
  auto mesh = std::make_shared<sw::distributed::DeviceMesh>(world, layout.layout("dp"));
  const auto tp = mesh->group({"tp"});
  Params full = full_model();
  std::vector<std::pair<std::string, torch::Tensor>> named(full.begin(), full.end());
  named.emplace_back("tie_copy", full.at("tie"));
  auto mine = std::make_shared<const sw::tensor_parallel::ShardedParameters>(named, split_rule, tp);
  // Stage 0: the tie's projection and the first MLP; stage 1: the second MLP and the head.
  const sw::training::StageCut cut(model_blocks(mine, tp), {{0, 1}, {2, 3}}, mesh->coordinate("pp"),
                                   {"tie", "tie_copy"}, mine);
  sw::pipeline::PipelineOptions options;
  options.schedule = sw::pipeline::make_schedule({sw::pipeline::ScheduleKind::k1F1B, 2, 2, 1});
  options.rank = cut.stage();
  options.group = mesh->group({"pp"});
  options.data_parallel_group = mesh->group({"dp"});
  options.tied = {{0, "tie", 1, "tie_copy"}};
  options.loss = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  sw::pipeline::Pipeline pipeline({cut.mine()}, options);
  auto optimizer = std::make_shared<torch::optim::AdamW>(
      pipeline.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  const int64_t rows = kBatch / 2, first = mesh->coordinate("dp") * rows;
  for (int step = 1; step <= kSteps; ++step) {
    const Data& d = batch(step);
    pipeline.step(d.x.slice(0, first, first + rows), d.y.slice(0, first, first + rows));
    const double norm = cut.clip_grad_norm(kMaxNorm, options.group);
    if (rank == 0) saved.norms.push_back(norm);
    for (auto& group : optimizer->param_groups()) {
      group.options().set_lr(sw::training::warmup_cosine_lr(kSchedule, step));
    }
    optimizer->step();
    optimizer->zero_grad();
  }
  // The full state on rank 0 (the tie once) and the checkpoint pieces by the writer rule.
  auto gathered = cut.full_state(*mesh);
  sw::checkpoint::TrainingState state;
  sw::training::adamw_checkpoint(cut.slots(mesh), optimizer).save(state);
  std::lock_guard<std::mutex> lock(saved.mutex);
  saved.pieces.insert(saved.pieces.end(), state.pieces.begin(), state.pieces.end());
  for (const auto& item : gathered) saved.full[item.key()] = item.value();
}

TEST(TrainingComposition, PipelineOfTensorParallelStagesOverDataReplicasMatchesOneProcess) {
  batches();
  Params reference = full_model();
  const std::vector<double> norms = train_reference(reference);
  Saved saved;
  on_threads_with_store(8, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    pipeline_rank(rank, store, saved);
  });
  expect_norms(saved.norms, norms);
  expect_full_state(saved.full, reference);
  expect_pieces(saved, reference);
}

// dp 2 x tp 2: the tensor-parallel MLPs alone, as a tensor-parallel LibTorch model is trained:
// gradients averaged over dp, the clip over tp (mesh_gradients of the ShardedParameters), the
// full state by ShardedParameters::full_state, and the checkpoint slots by sharded_slots.
void tensor_parallel_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store, Saved& saved) {
  auto world = thread_world(rank, 4, store);
  sw::mesh::ParallelLayout layout({4, {}, /*tp=*/2, /*pp=*/1});
  sw::distributed::DeviceMesh mesh(world, layout.layout("dp"));
  const auto tp = mesh.group({"tp"}), dp = mesh.group({"dp"});
  Params full = full_model();
  full.erase("tie");
  auto mine = std::make_shared<const sw::tensor_parallel::ShardedParameters>(
      std::vector<std::pair<std::string, torch::Tensor>>(full.begin(), full.end()), split_rule, tp);
  auto optimizer = std::make_shared<torch::optim::AdamW>(
      mine->tensors(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  const int64_t rows = kBatch / 2, first = mesh.coordinate("dp") * rows;
  for (int step = 1; step <= kSteps; ++step) {
    const Data& d = batch(step);
    auto h = mlp(mlp(d.x.slice(0, first, first + rows), *mine, "s0.", tp), *mine, "s1.", tp);
    torch::mse_loss(h, d.y.slice(0, first, first + rows)).backward();
    sw::distributed::average_gradients(mine->tensors(), *dp);
    const sw::tensor_parallel::ClipOptions clip{kMaxNorm, tp};
    const double norm =
        sw::training::clip_grad_norm_over_mesh(sw::training::mesh_gradients(*mine), clip);
    if (rank == 0) saved.norms.push_back(norm);
    optimizer->param_groups()[0].options().set_lr(sw::training::warmup_cosine_lr(kSchedule, step));
    optimizer->step();
    optimizer->zero_grad();
  }
  const auto gathered = mine->full_state();  // every rank holds the whole tensors
  sw::checkpoint::TrainingState state;
  sw::training::adamw_checkpoint(sw::training::sharded_slots(mine, mesh.layout(), mesh.rank()),
                                 optimizer)
      .save(state);
  std::lock_guard<std::mutex> lock(saved.mutex);
  saved.pieces.insert(saved.pieces.end(), state.pieces.begin(), state.pieces.end());
  for (const auto& item : gathered) {
    auto& kept = saved.full[item.key()];
    if (kept.defined()) EXPECT_TRUE(torch::equal(kept, item.value())) << item.key() << " differs";
    kept = item.value();
  }
}

TEST(TrainingComposition, TensorParallelMlpsOverDataReplicasMatchOneProcess) {
  batches();
  Params reference = full_model();
  reference.erase("tie");
  const std::vector<double> norms = train_reference(reference);
  Saved saved;
  on_threads_with_store(4, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    tensor_parallel_rank(rank, store, saved);
  });
  expect_norms(saved.norms, norms);
  expect_full_state(saved.full, reference);
  expect_pieces(saved, reference);
}

// dp 2 x tp 2: ZeRO-2 over the data axis steps the tensor-parallel MLPs, its clip told which
// parameters are split over tp (ZeroTensorParallel).
void zero_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store, Saved& saved) {
  auto world = thread_world(rank, 4, store);
  sw::mesh::ParallelLayout layout({4, {}, /*tp=*/2, /*pp=*/1});
  sw::distributed::DeviceMesh mesh(world, layout.layout("dp"));
  const auto tp = mesh.group({"tp"});
  Params full = full_model();
  full.erase("tie");
  const sw::tensor_parallel::ShardedParameters mine({full.begin(), full.end()}, split_rule, tp);
  std::vector<bool> split;
  std::vector<sw::training::StagedParameter> staged;
  for (const auto& [name, t] : mine.named()) {
    split.push_back(mine.split(name));
    staged.push_back({name, mine.full_shape(name), t});
  }
  sw::zero::ZeroOptions options;
  options.stage = 2;
  options.group = mesh.group({"dp"});
  options.gradient_clipping = kMaxNorm;
  options.optimizer.weight_decay = 0.1;
  options.tensor_parallel = {tp, split};
  sw::zero::ZeroRedundancyOptimizer optimizer(mine.tensors(), options);
  const int64_t rows = kBatch / 2, first = mesh.coordinate("dp") * rows;
  for (int step = 1; step <= kSteps; ++step) {
    const Data& d = batch(step);
    auto h = mlp(mlp(d.x.slice(0, first, first + rows), mine, "s0.", tp), mine, "s1.", tp);
    torch::mse_loss(h, d.y.slice(0, first, first + rows)).backward();
    optimizer.param_groups()[0].options().set_lr(sw::training::warmup_cosine_lr(kSchedule, step));
    optimizer.step();
    optimizer.zero_grad();
  }
  auto gathered = sw::training::gather_full_state(
      mesh, {staged},
      [&](const std::string& name, const torch::Tensor& v) { return mine.gather(name, v); });
  std::lock_guard<std::mutex> lock(saved.mutex);
  for (const auto& item : gathered) saved.full[item.key()] = item.value();
}

TEST(TrainingComposition, ZeroOverTheDataAxisOfTensorParallelMlpsMatchesOneProcess) {
  batches();
  Params reference = full_model();
  reference.erase("tie");
  train_reference(reference);
  Saved saved;
  on_threads_with_store(4, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    zero_rank(rank, store, saved);
  });
  expect_full_state(saved.full, reference);
}

// fsdp 2 x tp 2: FSDP over the data axis of a module whose parameters are tp shards.

// One MLP holding this rank's tp shards of stage `prefix`'s MLP as up.weight, up.bias,
// down.weight and down.bias, so FSDP shards them; forward reads them as registered then (FSDP
// swaps in the gathered values around it).
struct TpMlpImpl : torch::nn::Module {
  TpMlpImpl(const sw::tensor_parallel::ShardedParameters& mine,
            const std::string& prefix,
            sw::tensor_parallel::Group tp)
      : tp(std::move(tp)) {
    for (const std::string layer : {"up", "down"}) {
      auto holder = register_module(layer, std::make_shared<torch::nn::Module>());
      for (const std::string kind : {"weight", "bias"}) {
        holder->register_parameter(kind, mine.at(prefix + layer + "." + kind).detach().clone());
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    Params p;
    for (const auto& item : named_parameters()) p["s." + item.key()] = item.value();
    return mlp(x, p, "s.", tp);
  }
  sw::tensor_parallel::Group tp;
};
TORCH_MODULE(TpMlp);

struct TpMlpsImpl : torch::nn::Module {
  TpMlpsImpl(const sw::tensor_parallel::ShardedParameters& mine, sw::tensor_parallel::Group tp) {
    blocks->push_back(TpMlp(mine, "s0.", tp));
    blocks->push_back(TpMlp(mine, "s1.", tp));
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) { return blocks->forward(x); }
  torch::nn::Sequential blocks;
};
TORCH_MODULE(TpMlps);

// The reference's name of FSDP's "blocks.<i>.<rest>": "s<i>.<rest>".
std::string reference_name(const std::string& fsdp_name) {
  const std::string rest = fsdp_name.substr(std::string("blocks.").size());
  return "s" + rest;
}

void fsdp_tp_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store, Saved& saved) {
  auto world = thread_world(rank, 4, store);
  sw::mesh::ParallelLayout layout({4, {}, /*tp=*/2, /*pp=*/1});
  sw::distributed::DeviceMesh mesh(world, layout.layout("fsdp"));
  const auto tp = mesh.group({"tp"}), data = mesh.group({"fsdp"});
  Params full = full_model();
  full.erase("tie");
  const sw::tensor_parallel::ShardedParameters mine({full.begin(), full.end()}, split_rule, tp);
  TpMlps model(mine, tp);
  sw::fsdp::FullyShardOptions options;
  options.shard_group = data;
  sw::fsdp::FullyShardedDataParallel<TpMlps> fsdp(model, options, {&model->blocks});
  torch::optim::AdamW optimizer(fsdp.parameters(),
                                torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  const auto slices = fsdp.shard_slices();  // slice i names parameters()[i]
  const int64_t rows = kBatch / 2, first = mesh.coordinate("fsdp") * rows;
  for (int step = 1; step <= kSteps; ++step) {
    const Data& d = batch(step);
    auto out = fsdp.forward(d.x.slice(0, first, first + rows));
    torch::mse_loss(out, d.y.slice(0, first, first + rows)).backward();
    std::vector<std::pair<std::string, torch::Tensor>> named;
    const auto shards = fsdp.parameters();
    for (size_t i = 0; i < shards.size(); ++i) named.emplace_back(slices[i].name, shards[i]);
    const auto grads = sw::training::mesh_gradients(
        named, [&](const std::string& name) { return mine.split(reference_name(name)); });
    const sw::tensor_parallel::ClipOptions clip{kMaxNorm, tp, data, sw::tensor_parallel::Group()};
    const double norm = sw::training::clip_grad_norm_over_mesh(grads, clip);
    if (rank == 0) saved.norms.push_back(norm);
    for (auto& group : optimizer.param_groups()) {
      group.options().set_lr(sw::training::warmup_cosine_lr(kSchedule, step));
    }
    optimizer.step();
    optimizer.zero_grad();
  }
  std::vector<sw::training::StagedParameter> staged;
  for (const auto& item : fsdp.full_state_dict()) {  // whole over fsdp, tp shards as they are
    const std::string name = reference_name(item.key());
    staged.push_back({name, mine.full_shape(name), item.value()});
  }
  auto gathered = sw::training::gather_full_state(
      mesh, {staged},
      [&](const std::string& name, const torch::Tensor& v) { return mine.gather(name, v); });
  std::lock_guard<std::mutex> lock(saved.mutex);
  for (const auto& item : gathered) saved.full[item.key()] = item.value();
}

TEST(TrainingComposition, FsdpOverTheDataAxisOfTensorParallelMlpsMatchesOneProcess) {
  batches();
  Params reference = full_model();
  reference.erase("tie");
  const std::vector<double> norms = train_reference(reference);
  Saved saved;
  on_threads_with_store(4, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    fsdp_tp_rank(rank, store, saved);
  });
  expect_norms(saved.norms, norms);
  expect_full_state(saved.full, reference);
}

}  // namespace
