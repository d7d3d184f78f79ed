// The LibTorch example of docs/libtorch.md (shortened in the README): FSDP over torch::nn
// modules from C++, no Python.
//   torchrun --no-python --standalone --nproc_per_node=2 ./fsdp_quickstart   (or run it alone)
#include <shardwise/shardwise.h>
#include <torch/torch.h>

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(64, 64))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::gelu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 4; ++i) blocks->push_back(Block());
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return head(blocks->forward(x)); }
  torch::nn::Sequential blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

int main() {
  // Under torchrun: the shardwise backend over a TCPStore. Without torchrun: one process.
  auto world = shardwise::distributed::init_from_env_or_single();
  Net model;
  shardwise::fsdp::FullyShardOptions options;
  options.shard_group = world.group;
  options.param_dtype = torch::kBFloat16;  // optional: bf16 compute, fp32 shards
  // Each block becomes an FSDP unit, and the rest of the model is the root unit.
  shardwise::fsdp::FullyShardedDataParallel<Net> fsdp(model, options, {&model->blocks});
  torch::optim::AdamW optimizer(fsdp.parameters(), torch::optim::AdamWOptions(1e-3));
  torch::manual_seed(world.rank());
  auto x = torch::randn({8, 64}), y = x.sum(1, true) / 8;  // this rank's batch
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    auto loss = torch::mse_loss(fsdp.forward(x).to(torch::kFloat), y);
    loss.backward();  // gradients arrive reduced and sharded
    fsdp.clip_grad_norm_(1.0);
    optimizer.step();
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  auto full = fsdp.full_state_dict();  // names as in the unwrapped model ("blocks.0.fc.weight")
  if (world.rank() == 0) {
    std::printf("loss %.4f -> %.4f; %zu full tensors, e.g. %s\n", first, last, full.size(),
                full.keys()[0].c_str());
  }
  return last < first ? 0 : 1;
}
