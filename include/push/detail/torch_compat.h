#pragma once
// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (pip wheel, CUDA) differ for
// push. Everything else in the project compiles unchanged against both.
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/version.h>

#include <cstdint>

#define PUSH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace push::compat {

/// Blocks until the work queued on `device` is done (a no-op off CUDA).
inline void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

/// Whether the host store should use page-locked memory for `device`.
inline bool wants_pinned_host(const torch::Device& device) { return device.is_cuda(); }

/// CUDA devices visible to this process (0 on CPU builds of LibTorch).
inline int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

}  // namespace push::compat

// push::dist's CUDA backend (configure with -DPUSH_WITH_NCCL=ON against a CUDA LibTorch).
// LibTorch 1.13's ProcessGroupNCCL is a c10d::ProcessGroup; 2.x made it a c10d::Backend.
// Both take the same collective calls, so push::dist only needs the type and a factory.
#if PUSH_WITH_NCCL
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace push::compat {

using NcclGroup = c10d::ProcessGroupNCCL;

/// An NCCL group over `ranks` (this process's rank included), rendezvous under `prefix`.
template <class World>
c10::intrusive_ptr<NcclGroup> make_nccl_group(const World& world, const std::string& prefix,
                                              const std::vector<int>& ranks,
                                              std::chrono::milliseconds timeout) {
  auto options = NcclGroup::Options::create();
  options->timeout = timeout;
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, world.store());
  const int rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), world.rank()) - ranks.begin());
  return c10::make_intrusive<NcclGroup>(store, rank, static_cast<int>(ranks.size()), options);
}

}  // namespace push::compat
#endif
