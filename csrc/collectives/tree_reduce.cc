// Deterministic reductions: every element of the result is the sum of the ranks' values
// associated as the balanced binary tree over the rank index,
//   ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)),
// whatever the transport, the segmenting or the message sizes; the group size must be a power of
// two. With collectives/pairwise_sum.h over the leaves a rank adds up by itself, a training run
// sums its gradients in one tree that does not depend on the world size.
//
// Reduce-scatter by recursive halving at doubling distance. The `work` buffer (in the
// accumulation type, float32 for 16-bit floats) holds `size` blocks, block b the part rank b
// ends up owning. Before round k = 0 .. log2(size) - 1, rank r holds the blocks whose low k bits
// equal its own, each summed over its aligned group of 2^k ranks (those whose rank differs from
// r in the low k bits only). In round k it pairs with partner = r ^ 2^k, sends the held blocks
// whose bit k is the partner's, receives the partner's sums of the blocks whose bit k is its own
// and adds them: a sum over 2^(k + 1) ranks, as (lower half's sum) + (upper half's sum). After
// the last round it holds block r, summed over every rank in the tree's order.
//
// The all-gather that completes tree_allreduce runs the rounds backwards (k = log2(size) - 1 ..
// 0), each rank sending every block it holds to its partner: copies only, no arithmetic.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"

namespace shardwise::collectives {
namespace {

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

void check_tree(const Transport& transport, const CollectiveOptions& options, const char* op) {
  if (!is_power_of_two(transport.size())) {
    throw std::invalid_argument(
        std::string(op) + ": the deterministic tree needs a power-of-two group size, got " +
        std::to_string(transport.size()) + "; use a group of 1, 2, 4, 8, .. ranks");
  }
  if (!is_floating(options.dtype) ||
      (options.op != ReduceOp::kSum && options.op != ReduceOp::kAvg)) {
    throw std::invalid_argument(std::string(op) + ": the deterministic tree sums floating-point " +
                                "tensors (SUM or AVG); got " + reduce_op_name(options.op) + " of " +
                                datatype_name(options.dtype));
  }
}

// `work`: `size` blocks (chunk_of(total, size, b)) of the accumulation type `wide`.
class TreeRounds {
 public:
  TreeRounds(Transport& t, char* work, size_t total, Datatype wide, const CollectiveOptions& o)
      : t_(t), work_(work), total_(total), wide_(wide), element_(element_size(wide)), options_(o) {
    buffer_.resize(total * element_);
  }

  void reduce_scatter() {
    for (int bit = 1; bit < t_.size(); bit <<= 1) exchange(bit, /*reduce=*/true);
  }

  void all_gather() {
    for (int bit = t_.size() >> 1; bit >= 1; bit >>= 1) exchange(bit, /*reduce=*/false);
  }

 private:
  // Blocks held before the round of `bit` (low bits below it equal this rank's) whose `bit` is
  // `value`, in increasing order.
  std::vector<int> blocks(int bit, int value, bool before_gather) const {
    // Reduce-scatter: held before the round = low bits below `bit` equal r's. All-gather round
    // of `bit`: held = low bits up to and including `bit` equal r's; the partner holds those
    // with `bit` flipped; both then hold the union.
    const int low = before_gather ? (bit << 1) - 1 : bit - 1;
    std::vector<int> out;
    const int mask = low & ~bit;
    for (int b = 0; b < t_.size(); ++b) {
      if ((b & mask) == (t_.rank() & mask) && ((b & bit) != 0) == (value != 0)) out.push_back(b);
    }
    return out;
  }

  size_t pack(const std::vector<int>& list, char* out) const {
    size_t bytes = 0;
    for (int b : list) {
      const auto c = detail::chunk_of(total_, t_.size(), b);
      if (c.count == 0) continue;  // fewer elements than ranks: nothing to copy
      std::memcpy(out + bytes, work_ + c.offset * element_, c.count * element_);
      bytes += c.count * element_;
    }
    return bytes;
  }

  void exchange(int bit, bool reduce) {
    const int partner = t_.rank() ^ bit;
    const int mine = t_.rank() & bit;
    // reduce: send the blocks whose bit is the partner's, receive ours; gather: send what we
    // hold, receive what the partner holds.
    const auto send_list = blocks(bit, reduce ? (partner & bit) : mine, !reduce);
    const auto recv_list = blocks(bit, reduce ? mine : (partner & bit), !reduce);
    size_t recv_bytes = 0;
    for (int b : recv_list) recv_bytes += detail::chunk_of(total_, t_.size(), b).count * element_;
    char* send = buffer_.data();
    const size_t send_bytes = pack(send_list, send);
    std::vector<char> received(recv_bytes);
    t_.sendrecv(partner, {send, send_bytes}, partner, {received.data(), recv_bytes}, options_.tag,
                options_.deadline);
    size_t at = 0;
    for (int b : recv_list) {
      const auto c = detail::chunk_of(total_, t_.size(), b);
      if (c.count == 0) continue;  // (an empty message's buffer may be null)
      char* target = work_ + c.offset * element_;
      if (reduce) {
        reduce_into(target, received.data() + at, c.count, wide_, ReduceOp::kSum);
      } else {
        std::memcpy(target, received.data() + at, c.count * element_);
      }
      at += c.count * element_;
    }
  }

  Transport& t_;
  char* work_;
  size_t total_;
  Datatype wide_;
  size_t element_;
  const CollectiveOptions& options_;
  std::vector<char> buffer_;
};

}  // namespace

void tree_allreduce(Transport& transport,
                    void* data,
                    size_t count,
                    const CollectiveOptions& options) {
  check_tree(transport, options, "tree_allreduce");
  if (count == 0 || transport.size() == 1) return;
  const Datatype wide = accumulation_type(options.dtype);
  const size_t in_element = element_size(options.dtype);
  const size_t element = element_size(wide);
  // Pieces of at most max_segment_bytes per rank's block, each reduced then gathered whole.
  const size_t piece = std::max<size_t>(1, options.max_segment_bytes / element) * transport.size();
  std::vector<char> widened(std::min(piece, count) * element);
  for (size_t first = 0; first < count; first += piece) {
    const size_t n = std::min(piece, count - first);
    char* at = static_cast<char*>(data) + first * in_element;
    char* work = at;
    if (wide != options.dtype) {
      widen(at, widened.data(), n, options.dtype);
      work = widened.data();
    }
    TreeRounds rounds(transport, work, n, wide, options);
    rounds.reduce_scatter();
    rounds.all_gather();
    if (options.op == ReduceOp::kAvg) finish_average(work, n, wide, transport.size());
    if (wide != options.dtype) narrow(work, at, n, options.dtype);
  }
}

void tree_reduce_scatter(Transport& transport,
                         const void* input,
                         void* output,
                         size_t count,
                         const CollectiveOptions& options) {
  check_tree(transport, options, "tree_reduce_scatter");
  if (count == 0) return;
  const int size = transport.size();
  const Datatype wide = accumulation_type(options.dtype);
  const size_t in_element = element_size(options.dtype);
  const size_t element = element_size(wide);
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes / element);
  std::vector<char> work(std::min(segment, count) * size * element);
  const char* in = static_cast<const char*>(input);
  for (size_t first = 0; first < count; first += segment) {
    const size_t n = std::min(segment, count - first);
    // This segment of every block, block after block: chunk_of(n * size, size, b) is block b.
    for (int b = 0; b < size; ++b) {
      const char* from = in + (static_cast<size_t>(b) * count + first) * in_element;
      char* to = work.data() + static_cast<size_t>(b) * n * element;
      if (wide != options.dtype) {
        widen(from, to, n, options.dtype);
      } else {
        std::memcpy(to, from, n * element);
      }
    }
    TreeRounds rounds(transport, work.data(), n * size, wide, options);
    rounds.reduce_scatter();
    char* mine = work.data() + static_cast<size_t>(transport.rank()) * n * element;
    if (options.op == ReduceOp::kAvg) finish_average(mine, n, wide, size);
    char* out = static_cast<char*>(output) + first * in_element;
    if (wide != options.dtype) {
      narrow(mine, out, n, options.dtype);
    } else {
      std::memcpy(out, mine, n * element);
    }
  }
}

}  // namespace shardwise::collectives
