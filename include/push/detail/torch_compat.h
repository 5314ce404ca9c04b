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
