// ZeRO stages 0-2 (DeepSpeed's semantics) and the optimizer half of stage 3, usable from LibTorch.
//
// Partitioned mode (stages 0, 1, 2). The trainable parameters, in reverse order (the order their
// gradients arrive in backward), are grouped into buckets of at most `reduce_bucket_numel`
// elements. Each bucket has a sharding::FlatLayout over the data-parallel group, so rank r owns
// its piece of every parameter of every bucket; the concatenation of those shards is the rank's
// *partition*. Per rank the optimizer keeps, for its partition only, the fp32 master weights and
// the optimizer state (exp_avg, exp_avg_sq for AdamW; a momentum buffer for SGD).
// - stage 0: no partitioning (a layout of world 1): gradients are all-reduced and every rank
//   steps every element, like DDP.
// - stage 1: at the accumulation boundary (step()), each bucket's full gradients are packed
//   (reduce_scatter_copy_in_) and reduce-scattered into the partition's gradient.
// - stage 2: the same reduce-scatter runs during backward, as soon as a bucket's gradients have
//   all been accumulated (a post-accumulate-grad hook per parameter counts them), overlapped with
//   the rest of backward; `.grad` is released right away, and the partition's gradient (the
//   parameters' dtype, 1/N of the model) accumulates over micro-steps.
// step() then (fp16) checks every rank's gradients for inf/nan, (gradient_clipping) computes the
// global norm from the partitions, and runs the fused AdamW/SGD (optim/) on the fp32 partition
// with grad_scale = clip coefficient / loss scale, writing the parameters' low-precision copy in
// the same pass; every bucket is then all-gathered back into the parameters.
//
// Local mode (stage 3): the FSDP engine already shards parameters (fp32 master shards) and
// gradients; the optimizer steps the given shard tensors in place, and only the overflow flag
// and the gradient norm are reduced over the group.
//
// Tensor parallelism (options.tensor_parallel): the data-parallel group is one data axis of a
// TP model, whose parameters are this tp rank's shards. The gradient norm then sums the squares
// of split parameters over the tp group and counts replicated ones (equal on every tp rank) once,
// as tensor_parallel::clip_grad_norm_ does; the fp16 overflow flag is agreed over the tp group too,
// so every rank of the mesh skips the same steps.
//
// Optimizer state is described as pieces (parameter id, first element, count), so a checkpoint
// taken at one world size loads at any other (load_state_pieces copies the overlaps).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "distributed/tree_reduce.h"
#include "sharding/flat_layout.h"
#include "zero/loss_scaler.h"

namespace shardwise::zero {

enum class OptimizerKind { kAdamW, kSgd, kLamb };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  // LAMB (optim/lamb.h, DeepSpeed's FusedLamb); beta1, beta2, eps and weight_decay above
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
};

struct ZeroTensorParallel {
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // null: no tensor parallelism
  std::vector<bool> split;  // by parameter id (PieceInfo::param): split over `group`
};

struct ZeroOptions {
  int stage = 1;                                 // 0, 1, 2 (partitioned) or 3 (local)
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // data-parallel group; null: one process
  int64_t reduce_bucket_numel = 500'000'000;     // reduce_bucket_size
  // allgather_bucket_size, DeepSpeed's rule: a bucket's updated shard of S elements is
  // all-gathered in max(1, S x world / this) calls of S / that many elements each (the last one
  // takes the remainder).
  int64_t allgather_bucket_numel = 500'000'000;
  bool overlap_comm = true;        // stage 2: asynchronous reduce-scatters
  bool offload_optimizer = false;  // master weights and state in CPU memory
  bool pin_memory = false;         // offload_optimizer.pin_memory: page-locked, for GPU parameters
  double gradient_clipping = 0.0;  // max global norm; 0: off
  // Stages 0-2: gradients are divided by this before the reduction and by dp_size / it after
  // (folded into the optimizer's gradient scale): DeepSpeed's gradient_predivide_factor, and
  // prescale_gradients = the data-parallel size. 0: the data-parallel size.
  double gradient_predivide_factor = 0.0;
  std::optional<LossScalerOptions> loss_scaler;  // fp16 only
  // Deterministic training (the same bits at every data-parallel size): every stage reduces each
  // micro-batch during backward (stages 0 and 1 too), in float32, by the tree over the rank index
  // (distributed/tree_reduce.h); the micro-batches' reduced partitions are added by the tree over
  // their index, restarted by zero_grad; gradients are summed, not averaged (the caller divides
  // the loss by the global micro-batch count), so gradient_predivide_factor, which splits the
  // average's division, has nothing to split; the clip norm is summed exactly. Power-of-two
  // groups.
  bool deterministic = false;
  OptimizerOptions optimizer;
  ZeroTensorParallel tensor_parallel;
};

// Where a state tensor lies in a parameter: elements [start, start + numel) of parameter `param`
// (flattened), whose full size is `full_numel`.
struct PieceInfo {
  int64_t param = 0;
  int64_t start = 0;
  int64_t numel = 0;
  int64_t full_numel = 0;
};

struct StatePiece {
  PieceInfo info;
  std::map<std::string, at::Tensor> tensors;  // "master", "exp_avg", "exp_avg_sq" / "momentum"
};

class ZeroOptimizer : public std::enable_shared_from_this<ZeroOptimizer> {
 public:
  // Partitioned mode (stage 0-2): `params` are the model's trainable parameters (contiguous,
  // one dtype and device, identical on every rank).
  static std::shared_ptr<ZeroOptimizer> create(std::vector<at::Tensor> params, ZeroOptions options);
  // Local mode (stage 3): `shards` are fp32 shard tensors stepped in place (their `.grad` is the
  // gradient); `pieces[i]` says where shards[i] lies in its parameter.
  static std::shared_ptr<ZeroOptimizer> create_local(std::vector<at::Tensor> shards,
                                                     std::vector<PieceInfo> pieces,
                                                     ZeroOptions options);

  // The accumulation boundary: reduces (stages 0/1), unscales, clips and steps. Returns false
  // when an fp16 overflow skipped the step (on every rank alike).
  bool step();
  void zero_grad();
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  double last_grad_norm() const { return last_norm_; }
  int64_t step_count() const { return step_count_; }
  // LAMB: the last step's trust ratio per parameter (DeepSpeed's get_lamb_coeffs); undefined
  // before the first step or with another optimizer.
  at::Tensor lamb_coefficients() const { return lamb_coefficients_; }
  void set_lr(double lr) { options_.optimizer.lr = lr; }
  const ZeroOptions& options() const { return options_; }

  std::vector<StatePiece> state_pieces() const;
  // Copies every overlap of `saved` (pieces from any world size) into this rank's state and,
  // in partitioned mode, the parameters.
  void load_state_pieces(const std::vector<StatePiece>& saved, int64_t step_count);
  const LossScalerState* scaler_state() const { return scaler_ ? &scaler_->state() : nullptr; }
  void set_scaler_state(const LossScalerState& state);

  // Bytes held now by the partitioned master weights, optimizer state and gradient partition.
  int64_t master_bytes() const;
  int64_t state_bytes() const;
  int64_t grad_partition_bytes() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Elements of each bucket's shard on every rank (what each bucket all-gathers per rank).
  std::vector<int64_t> bucket_shard_numels() const {
    std::vector<int64_t> numels;
    for (const Bucket& b : buckets_) numels.push_back(b.layout.shard_numel());
    return numels;
  }
  // The master weights and optimizer state are page-locked (offload_optimizer + pin_memory).
  bool pinned() const { return !masters_.empty() && masters_[0].is_pinned(); }
  // The most gradient reductions ever outstanding at once: 1 with overlap_comm = false (each is
  // waited for before backward goes on), up to 2 with it.
  int max_in_flight() const { return max_in_flight_; }

 private:
  double predivide_factor() const {
    return options_.gradient_predivide_factor > 0 ? options_.gradient_predivide_factor
                                                  : static_cast<double>(dp_size_);
  }
  struct Bucket {
    std::vector<int64_t> params;  // indices into params_, in bucket order
    sharding::FlatLayout layout;
    int64_t offset = 0;  // first element of this bucket's shard in the partition
    int ready = 0;
    bool launched = false;
  };
  struct Reduction {
    int bucket;
    at::Tensor output;
    c10::intrusive_ptr<c10d::Work> work;
  };

  explicit ZeroOptimizer(ZeroOptions options);
  void init_partitioned(std::vector<at::Tensor> params);
  void init_local(std::vector<at::Tensor> shards, std::vector<PieceInfo> pieces);
  void allocate_state(const at::Tensor& like, int64_t numel);
  void on_grad_ready(int64_t param);
  void launch_ready_buckets();
  void launch_reduce(int bucket);
  void finish_oldest();
  void finalize_backward();
  at::Tensor reduce_all_now();
  std::vector<at::Tensor> local_grads() const;
  bool any_overflow(const std::vector<at::Tensor>& grads) const;
  double global_norm(const std::vector<at::Tensor>& grads) const;
  double tensor_parallel_norm(const std::vector<at::Tensor>& grads) const;
  // Calls fn(k, master, offset) for every piece k of pieces_: it lies at elements
  // [offset, offset + pieces_[k].numel) of masters_[master] (and of the matching gradient).
  void for_each_piece(const std::function<void(size_t, size_t, int64_t)>& fn) const;
  void run_optimizer(const std::vector<at::Tensor>& masters,
                     const std::vector<at::Tensor>& grads,
                     const std::vector<at::Tensor>& low,
                     const std::vector<std::vector<at::Tensor>>& state,
                     double grad_scale);
  void run_lamb(const std::vector<at::Tensor>& masters,
                const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& low,
                const std::vector<at::Tensor>& exp_avgs,
                const std::vector<at::Tensor>& exp_avg_sqs,
                double grad_scale);
  int64_t lamb_rows();
  void step_partitioned(const at::Tensor& grads, double grad_scale);
  void gather_parameters(const at::Tensor& partition);
  at::Tensor bucket_view(const at::Tensor& partition, int bucket) const;
  int part_rank() const { return world_ == 1 ? 0 : rank_; }

  ZeroOptions options_;
  bool local_ = false;
  int dp_size_ = 1;  // data-parallel size (gradients are averaged over it)
  int world_ = 1;    // ranks the state is partitioned over (1 for stage 0)
  int rank_ = 0;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // param -> bucket
  int64_t partition_numel_ = 0;
  std::vector<PieceInfo> pieces_;
  std::vector<at::Tensor> masters_;  // local mode: the shards; partitioned: one flat partition
  std::vector<std::vector<at::Tensor>> state_;  // per master: exp_avg, exp_avg_sq / momentum
  at::Tensor grad_partition_;                   // stage 2 (every stage when deterministic)
  // deterministic: per bucket, this step's reduced shards summed as the tree over micro-batches
  std::vector<distributed::PairwiseGradients> bucket_sums_;
  bool reduces_in_backward() const { return options_.stage == 2 || options_.deterministic; }
  at::ScalarType reduce_type() const {  // deterministic: every addition in float32
    return options_.deterministic ? at::kFloat : params_[0].scalar_type();
  }
  void check_deterministic() const;
  std::deque<Reduction> in_flight_;
  int max_in_flight_ = 0;
  std::array<at::Tensor, 2> reduce_buffers_;
  size_t reduces_issued_ = 0;
  size_t next_launch_ = 0;
  bool in_backward_ = false;
  bool grads_pending_ = false;  // stage 2: the partition holds unstepped gradients
  std::unique_ptr<LossScaler> scaler_;
  int64_t lamb_rows_ = -1;        // LAMB: parameters with a row of sums (agreed by the ranks)
  at::Tensor lamb_coefficients_;  // LAMB: the last step's trust ratio per parameter
  int64_t step_count_ = 0;
  double last_norm_ = 0.0;
};

}  // namespace shardwise::zero
