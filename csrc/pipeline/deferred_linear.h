// Deferred weight gradients for zero-bubble schedules (the split of a backward into I and W).
//
// deferred_linear(input, weight, bias) is at::linear with its own backward. When its forward
// ran while a WeightGradStore was installed on the thread (WeightGradStore::Capture, which the
// pipeline executor holds around every forward), the backward computes only the input gradient
// if that store is deferring at the time (the executor's I actions): the weight and bias
// gradients become a closure, queued in the store with the saved input and output gradient, and
// the executor's W action runs them later, accumulating into `weight.grad` and `bias.grad`.
// Otherwise (no store, or a whole backward B) all gradients are computed at once and autograd
// accumulates them as usual, so a module using deferred_linear trains the same anywhere.
//
// Under autocast the forward computes in the autocast dtype, as at::linear would; the deferred
// gradients are accumulated in the parameters' dtype. Deferred gradients bypass autograd's
// accumulation, so parameter hooks (e.g. FSDP's post-accumulate-grad hooks) do not see them.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

namespace shardwise::pipeline {

class WeightGradStore : public torch::CustomClassHolder {
 public:
  // Installs `store` as the thread's capturing store for its lifetime (restores the previous).
  class Capture {
   public:
    explicit Capture(WeightGradStore* store);
    ~Capture();
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;

   private:
    WeightGradStore* previous_;
  };
  static WeightGradStore* current();  // the thread's capturing store, or null

  void set_deferring(bool deferring) { deferring_ = deferring; }
  bool deferring() const { return deferring_; }
  void push(std::function<void()> work);      // called from backward (any thread)
  std::vector<std::function<void()>> take();  // the queued work, in queue order

 private:
  std::mutex mutex_;
  std::atomic<bool> deferring_{false};
  std::vector<std::function<void()>> queue_;
};

at::Tensor deferred_linear(const at::Tensor& input,
                           const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias = c10::nullopt);

}  // namespace shardwise::pipeline
