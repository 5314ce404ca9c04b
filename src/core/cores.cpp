#include <push/core/cores.h>

#include <sched.h>

#include <algorithm>
#include <thread>

namespace push {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  // A mask wider than cpu_set_t (over 1024 CPUs) fails with EINVAL: the CPUs online then.
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace push
