// LibTorch's CPU allocator is plain malloc. With glibc, a tensor of 128 KiB and more comes
// from mmap until a free raises the threshold, and free memory at the top of an arena
// beyond the trim threshold goes back to the system; in both cases the next tensor of that
// size touches fresh pages, one page fault per 4 KiB. A fused group's activations are
// such tensors, allocated and freed at every step: page faults took about half of a fused
// step of workload W (2.05 ms against 1.09 ms with both thresholds raised through
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, timed in a scratch program; the
// benchmarks in bench/bayes_bench.cpp show the whole run). So push fixes both thresholds: tensors up to 32 MiB (the
// largest threshold glibc accepts) come from the heap, and each arena keeps up to 256 MiB
// of freed memory for the next step. The cost is memory a process does not give back
// while it runs; a user who sets either variable, or GLIBC_TUNABLES, keeps their setting.
#include "runtime/heap.h"

#include <cstdlib>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace push::detail {

void keep_freed_memory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
      if (std::getenv(name) != nullptr) return;
    }
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
#endif
}

}  // namespace push::detail
