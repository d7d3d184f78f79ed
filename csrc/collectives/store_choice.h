// How a rank writes large messages into its shared-memory rings, chosen from what it measures.
//
// A ring line written with an ordinary store stays dirty in the writer's cache; the reader then
// takes it from that cache. Where the two cores share a last-level cache this is the fastest
// path (16 MiB all-reduce at world 2: 8.5-10 GB/s bus bandwidth on the 2-core virtual machines
// measured here). Where they do not (presumably a virtual machine's two vCPUs placed apart on
// the host: it changed from launch to launch and cannot be seen from inside), every line is
// pulled from the other core's cache and the same all-reduce ran at 2 GB/s, with no sleep at all.
// Streaming (non-temporal) stores send each line to memory instead, so the reader reads memory:
// 5-6 GB/s where the caches are shared, 8.5-9.5 GB/s where they are not.
//
// So a rank measures: each exchange of at least kMinBytes is timed, and its throughput kept per
// store kind and per size class (a factor of 4 apart from kMinBytes up: a 32 KiB message and an
// 8 MiB one move at different rates, so only like sizes are compared) as a moving average
// (weight kWeight for the newest). In each class the first kFirstSamples exchanges alternate the
// kinds (the later, warmer sample of each counts); then the faster is used, and every
// kExploreEvery-th exchange samples the other kind afresh, so a placement that changes mid-run
// is noticed. Ranks that run the same collectives count their
// exchanges alike, so they try the other kind at the same time. Smaller messages (an all-reduce
// of up to 64 KiB at world 2 sends 32 KiB pieces) always use ordinary stores, as before this
// choice existed: at those sizes the measured difference was within the launches' noise.
//
// Where this host's ranks outnumber its cores, the measured choice is not made (for_host): two
// ranks that take turns on one core share all of its caches, so ordinary stores are the fast kind,
// and a timed exchange there mostly measures how long the peer waited for the core, not the
// stores. At world 4 on 2 cores the measured choice ran 16 MiB all-reduces at 2.00 GB/s median
// over 10 launches against 2.50 with ordinary stores throughout (and 2.22 against 2.65 at 1 MiB).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace shardwise::collectives {

class StoreChoice {
 public:
  // kMeasured chooses as above; the others always use one kind (SHARDWISE_RING_STORES).
  enum class Kind { kMeasured, kOrdinary, kStreaming };
  explicit StoreChoice(Kind kind = Kind::kMeasured) : kind_(kind) {}

  // The kind a transport between `ranks` processes on a host of `cores` online CPUs uses when
  // asked for `requested`: kMeasured becomes kOrdinary where the ranks outnumber the cores (see
  // above); an explicit kind is kept.
  static constexpr Kind for_host(Kind requested, int ranks, long cores) {
    return requested == Kind::kMeasured && ranks > cores ? Kind::kOrdinary : requested;
  }
  Kind kind() const { return kind_; }

  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr int kClasses = 4;            // [64 KiB, 256 KiB), ..., [4 MiB, any)
  static constexpr uint64_t kFirstSamples = 4;  // ordinary, streaming, ordinary, streaming
  static constexpr uint64_t kExploreEvery = 32;
  static constexpr double kWeight = 0.25;

  // The size class of a message of `bytes` (>= kMinBytes).
  static int size_class(size_t bytes) {
    int c = 0;
    for (size_t bound = kMinBytes * 4; bytes >= bound && c < kClasses - 1; bound *= 4) ++c;
    return c;
  }

  // Whether the next exchange, sending `bytes`, should write with streaming stores.
  bool stream(size_t bytes) {
    if (bytes < kMinBytes || kind_ == Kind::kOrdinary) return false;
    if (kind_ == Kind::kStreaming) return true;
    Class& c = classes_[size_class(bytes)];
    ++c.exchanges;
    c.sampling = c.exchanges <= kFirstSamples || c.exchanges % kExploreEvery == 0;
    if (c.exchanges <= kFirstSamples) return c.streaming = c.exchanges % 2 == 0;
    const bool best = c.rate[1] > c.rate[0];
    return c.streaming = c.sampling ? !best : best;
  }

  // The exchange that stream(bytes) chose for took `took`. A sample (the first ones, the retries)
  // replaces its kind's rate; the kind in use keeps a moving average.
  void record(size_t bytes, std::chrono::nanoseconds took) {
    if (bytes < kMinBytes || took.count() <= 0 || kind_ != Kind::kMeasured) return;
    Class& c = classes_[size_class(bytes)];
    const double rate = static_cast<double>(bytes) / static_cast<double>(took.count());
    double& average = c.rate[c.streaming ? 1 : 0];
    average = c.sampling || average == 0 ? rate : (1 - kWeight) * average + kWeight * rate;
  }

  // Bytes per nanosecond measured for messages of `bytes`' class with ordinary or streaming
  // stores; 0: not measured yet.
  double rate(size_t bytes, bool streaming) const {
    return bytes < kMinBytes ? 0 : classes_[size_class(bytes)].rate[streaming ? 1 : 0];
  }

 private:
  struct Class {
    double rate[2] = {0, 0};
    uint64_t exchanges = 0;
    bool streaming = false;
    bool sampling = false;
  };
  Kind kind_;
  Class classes_[kClasses];
};

}  // namespace shardwise::collectives
