#include "runtime/lanes.h"

#include <push/core/cores.h>
#include <push/core/errors.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <thread>

#include "core/torch_compat.h"
#include "runtime/heap.h"

namespace push::detail {

namespace {

// The GPUs the lanes run on: every visible one, unless the options ask for the CPU.
int cuda_lanes_available(const PushOptions& options) {
  const auto type = options.device_type();
  PUSH_CHECK(!type || *type == torch::kCPU || *type == torch::kCUDA, "push::Push",
             "device_type must be CPU or CUDA, got ", *type);
  const int cuda = compat::cuda_device_count();
  if (type == torch::kCUDA) {
#if PUSH_WITH_CUDA
    PUSH_CHECK(cuda > 0, "push::Push", "device_type CUDA, but this process sees no CUDA device");
#else
    PUSH_CHECK(false, "push::Push", "device_type CUDA, but push was built against LibTorch ", TORCH_VERSION,
               " without CUDA (build with the torch2 preset)");
#endif
  }
  return type == torch::kCPU ? 0 : cuda;
}

}  // namespace

int Lanes::count(const PushOptions& options) {
  const int cuda = cuda_lanes_available(options);
  const int lanes = options.devices().value_or(cuda > 0 ? cuda : 1);
  PUSH_CHECK(lanes >= 1, "push::Push", "devices must be at least 1, got ", lanes);
  PUSH_CHECK(cuda == 0 || lanes <= cuda, "push::Push", "devices(", lanes, ") is more than the ", cuda,
             " CUDA devices of this machine");
  return lanes;
}

Lanes::Lanes(const PushOptions& options, int count, int ranks_on_host) {
  const int cuda = cuda_lanes_available(options);
  const int cores = usable_cores();
  const int threads = options.intra_op_threads().value_or(std::max(1, cores / (count * ranks_on_host)));
  PUSH_CHECK(threads >= 1, "push::Push", "intra_op_threads must be at least 1, got ", threads);
  // LibTorch builds its pthreadpool lazily in the first at::set_num_threads; done here,
  // before any lane thread calls it, the pool is built on this thread (lanes start after),
  // not by two threads at once (ThreadSanitizer saw a lane's build race with this thread's
  // use of the pool, in code it cannot see the guard of).
  at::set_num_threads(at::get_num_threads());
  keep_freed_memory();
  for (int i = 0; i < count; ++i) {
    LaneConfig config;
    config.index = i;
    config.device =
        cuda > 0 ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)) : torch::Device(torch::kCPU);
    config.cache_size = options.cache_size();
    config.view_size = options.view_size();
    config.intra_op_threads = threads;
    config.blas_threads = count == 1 ? threads : 1;  // OpenBLAS's pool is one per process
    config.stack_size = options.stack_size();
    lanes_.push_back(std::make_shared<Lane>(config));
  }
  for (auto& lane : lanes_) lane->start();
}

Lanes::~Lanes() { stop(); }

void Lanes::stop() {
  for (auto& lane : lanes_) lane->stop();
}

bool Lanes::owns_current_thread() const {
  const Lane* here = Lane::current();
  return here != nullptr && std::any_of(lanes_.begin(), lanes_.end(), [&](const auto& l) { return l.get() == here; });
}

}  // namespace push::detail
