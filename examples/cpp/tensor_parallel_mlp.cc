// LibTorch: train a tensor-parallel MLP (column-parallel up projection, row-parallel down
// projection, sequence parallelism) on two ranks, no Python. The ranks are threads sharing an
// in-memory store here; under torchrun each process would build its group from the environment.
// Built by CMake (target shardwise_example_tensor_parallel) when LibTorch is found; it checks
// that every step's loss equals the unsplit MLP's and exits 1 otherwise.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "backend/shardwise_backend.hpp"
#include "tensor_parallel/parallel_linear.h"
#include "tensor_parallel/shard_tensor.h"

namespace tp = shardwise::tensor_parallel;

namespace {

constexpr int kWorld = 2, kSteps = 5;

c10::intrusive_ptr<c10d::ProcessGroup> thread_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank) {
  auto backend = c10::make_intrusive<shardwise::backend::ShardwiseBackend>(
      c10::make_intrusive<c10d::PrefixStore>("tp", store), rank, kWorld,
      shardwise::backend::ShardwiseOptions{});
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, kWorld);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return group;
}

// Rank `rank`'s SGD steps on its shards; returns the losses.
std::vector<double> train(int rank,
                          const c10::intrusive_ptr<c10d::Store>& store,
                          const torch::Tensor& w_up,
                          const torch::Tensor& w_down,
                          const torch::Tensor& x,
                          const torch::Tensor& y) {
  const tp::ParallelOptions options{thread_group(store, rank), /*sequence_parallel=*/true, 1};
  auto shard = [&](const torch::Tensor& t, int64_t dim) {
    return tp::shard_tensor(t, {dim, 1, rank, kWorld, "mlp", "weight"}).requires_grad_();
  };
  torch::Tensor up = shard(w_up, 0), down = shard(w_down, 1);
  torch::optim::SGD opt({up, down}, 0.1);
  const torch::Tensor x_local = x.chunk(kWorld, 1)[rank], y_local = y.chunk(kWorld, 1)[rank];
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    torch::Tensor h = torch::gelu(tp::column_parallel_linear(x_local, up, std::nullopt, options));
    torch::Tensor out = tp::row_parallel_linear(h, down, std::nullopt, options);
    torch::Tensor loss = torch::mse_loss(out, y_local);  // this rank's tokens
    loss.backward();
    opt.step();
    opt.zero_grad();
    torch::Tensor total = loss.detach().clone();  // the mean over both ranks' tokens
    std::vector<at::Tensor> buf{total};
    options.group->allreduce(buf)->wait();
    losses.push_back(total.item<double>() / kWorld);
  }
  return losses;
}

}  // namespace

int main() {
  torch::manual_seed(0);
  const torch::Tensor w_up = torch::randn({64, 16}) * 0.2, w_down = torch::randn({16, 64}) * 0.2;
  const torch::Tensor x = torch::randn({4, 8, 16}), y = torch::randn({4, 8, 16});
  // The unsplit reference: one process, the whole MLP.
  torch::Tensor up = w_up.clone().requires_grad_(), down = w_down.clone().requires_grad_();
  torch::optim::SGD opt({up, down}, 0.1);
  std::vector<double> reference;
  for (int step = 0; step < kSteps; ++step) {
    // Each rank backpropagates the mean loss of its own tokens, and the layers' collectives
    // sum what reaches the shared weights: the gradient of the sum of both halves' losses.
    torch::Tensor out = torch::linear(torch::gelu(torch::linear(x, up)), down);
    torch::Tensor loss = (torch::mse_loss(out.chunk(kWorld, 1)[0], y.chunk(kWorld, 1)[0]) +
                          torch::mse_loss(out.chunk(kWorld, 1)[1], y.chunk(kWorld, 1)[1]));
    loss.backward();
    opt.step();
    opt.zero_grad();
    reference.push_back(loss.item<double>() / kWorld);
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::vector<double>> losses(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] { losses[rank] = train(rank, store, w_up, w_down, x, y); });
  }
  for (auto& t : threads) t.join();
  bool ok = true;
  for (int step = 0; step < kSteps; ++step) {
    const double ours = losses[0][step], ref = reference[step];
    ok = ok && std::abs(ours - ref) <= 1e-5 * std::abs(ref) && losses[1][step] == ours;
    std::cout << "step " << step << ": loss " << ours << " (unsplit " << ref << ")\n";
  }
  std::cout << (ok ? "tensor-parallel MLP matches the unsplit one\n" : "MISMATCH\n");
  return ok ? 0 : 1;
}
