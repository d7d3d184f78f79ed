// Bounded polling before a thread blocks, shared by the shared-memory transport and the backend.
//
// On the virtual machines measured here a futex wake-up costs 20-90 us, more than moving 64 KiB,
// so a waiter that expects its event soon polls first: for `budget` it checks `ready`, pausing
// the core between checks for the first kPauseFor and yielding it (sched_yield) after that, so
// another thread that shares the core still gets to run. Only then does the caller block. A zero
// budget polls once; callers pick zero when ranks outnumber cores.
#pragma once

#include <unistd.h>

#include <chrono>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shardwise {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Returns true as soon as ready() does, false once `budget` has passed without it.
template <typename Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds budget) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kPauseFor = std::chrono::microseconds(20);
  if (ready()) return true;
  if (budget.count() <= 0) return false;
  const Clock::time_point start = Clock::now();
  const Clock::time_point pause_end = start + std::min(budget, kPauseFor);
  const Clock::time_point end = start + budget;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    const Clock::time_point now = Clock::now();
    if (now >= end) return false;
    if (now >= pause_end) std::this_thread::yield();
  }
}

// The default polling budget for `ranks` busy processes on this host: kDefaultSpin when each can
// have a core of its own (online CPUs >= ranks), else zero.
constexpr std::chrono::microseconds kDefaultSpin{1000};
inline std::chrono::microseconds default_spin(int ranks) {
  return ::sysconf(_SC_NPROCESSORS_ONLN) >= ranks ? kDefaultSpin : std::chrono::microseconds(0);
}

}  // namespace shardwise
