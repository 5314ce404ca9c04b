#pragma once
// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (pip wheel, CUDA) differ for
// push. Everything else in the project compiles unchanged against both.
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/cuda.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/version.h>

#include <array>
#include <charconv>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>

#define PUSH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace push::compat {

/// The key of a parameter's entry in Optimizer::state(): the TensorImpl's address as text
/// in 1.13, the address itself in later versions (taken from the map's own key type).
using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& t) {
  if constexpr (std::is_same_v<Key, std::string>) {
    // What c10::guts::to_string gives for a pointer (an ostream's "0x" and lowercase hex),
    // without an ostringstream: a fused write-back looks up hundreds of these per epoch.
    const auto address = reinterpret_cast<std::uintptr_t>(t.unsafeGetTensorImpl());
    if (address == 0) return "0";
    std::array<char, 2 + 2 * sizeof(std::uintptr_t)> text{'0', 'x'};
    const auto end = std::to_chars(text.data() + 2, text.data() + text.size(), address, 16).ptr;
    return std::string(text.data(), end);
  } else {
    return t.unsafeGetTensorImpl();
  }
}

/// The explicit padding held by a convolution's padding option (a variant of an array
/// and the kValid / kSame tags), or nullptr when it holds a tag. c10::variant became
/// std::variant in 2.1.
template <class Array, class Padding>
const Array* explicit_padding(const Padding& padding) {
#if PUSH_TORCH_AT_LEAST(2, 1)
  return std::get_if<Array>(&padding);
#else
  return c10::get_if<Array>(&padding);
#endif
}

/// Whether this LibTorch's TCPStore client speaks the protocol of torchrun 2.x's agent
/// store. It does not in 1.13: 2.0 renumbered the store's queries (a validation query came
/// first), so a 1.13 client's requests to a 2.x server go unanswered.
inline constexpr bool kJoinsTorchrun2Store = PUSH_TORCH_AT_LEAST(2, 0);

/// Whether the host store should use page-locked memory for `device`.
inline bool wants_pinned_host(const torch::Device& device) { return device.is_cuda(); }

/// CUDA devices visible to this process (0 on CPU builds of LibTorch).
inline int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

/// Whether the autograd engine is running a backward pass on this thread (a hook is
/// running inside it). Both 1.13 and 2.x expose the current graph task's exec info,
/// non-null exactly while one is current.
inline bool in_backward_pass() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

/// A thread's autocast state, which LibTorch keeps in thread_locals outside
/// at::ThreadLocalState (1.13 saves only the enabled flags, as dispatch keys, there):
/// per device type the enabled flag and the lower-precision dtype, the cache flag, and the
/// nesting count. The cache of casts itself cannot be saved (no API reads it).
class AutocastState {
 public:
  static AutocastState capture() {
    AutocastState s;
    for (std::size_t i = 0; i < kTypes.size(); ++i) {
      s.enabled_[i] = is_enabled(kTypes[i]);
      s.dtype_[i] = dtype(kTypes[i]);
    }
    s.cache_enabled_ = at::autocast::is_autocast_cache_enabled();
    s.nesting_ = at::autocast::increment_nesting() - 1;  // no getter: read by a round trip
    at::autocast::decrement_nesting();
    return s;
  }

  /// Makes this the thread's state, given that `current` is: only what differs is set, so
  /// a switch between handlers that leave autocast alone costs no writes.
  void restore_over(const AutocastState& current) const {
    for (std::size_t i = 0; i < kTypes.size(); ++i) {
      if (enabled_[i] != current.enabled_[i]) set_enabled(kTypes[i], enabled_[i]);
      if (dtype_[i] != current.dtype_[i]) set_dtype(kTypes[i], dtype_[i]);
    }
    if (cache_enabled_ != current.cache_enabled_) {
      at::autocast::set_autocast_cache_enabled(cache_enabled_);
    }
    for (int n = current.nesting_; n < nesting_; ++n) at::autocast::increment_nesting();
    for (int n = current.nesting_; n > nesting_; --n) at::autocast::decrement_nesting();
  }

  /// Whether autocast is on for any device type on this thread now.
  static bool enabled_now() {
    for (c10::DeviceType type : kTypes) {
      if (is_enabled(type)) return true;
    }
    return false;
  }

  bool any_enabled() const {
    for (bool e : enabled_) {
      if (e) return true;
    }
    return false;
  }

  /// This thread's autocast dtype for `type` (CPU or CUDA).
  static at::ScalarType dtype(c10::DeviceType type) {
#if PUSH_TORCH_AT_LEAST(2, 4)
    return at::autocast::get_autocast_dtype(type);
#else
    return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
  }
  static void set_dtype(c10::DeviceType type, at::ScalarType dtype) {
#if PUSH_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_dtype(type, dtype);
#else
    if (type == c10::DeviceType::CPU) {
      at::autocast::set_autocast_cpu_dtype(dtype);
    } else {
      at::autocast::set_autocast_gpu_dtype(dtype);
    }
#endif
  }

  /// Whether autocast is on for `type` (CPU or CUDA) on this thread.
  static bool is_enabled(c10::DeviceType type) {
#if PUSH_TORCH_AT_LEAST(2, 4)
    return at::autocast::is_autocast_enabled(type);
#else
    return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
  }
  static void set_enabled(c10::DeviceType type, bool enabled) {
#if PUSH_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(type, enabled);
#else
    if (type == c10::DeviceType::CPU) {
      at::autocast::set_cpu_enabled(enabled);
    } else {
      at::autocast::set_enabled(enabled);
    }
#endif
  }

 private:
  static constexpr std::array<c10::DeviceType, 2> kTypes = {c10::DeviceType::CPU, c10::DeviceType::CUDA};
  std::array<bool, 2> enabled_{};
  std::array<at::ScalarType, 2> dtype_{};
  bool cache_enabled_ = true;
  int nesting_ = 0;
};

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
                                              const std::vector<int>& ranks, std::chrono::milliseconds timeout) {
  auto options = NcclGroup::Options::create();
  options->timeout = timeout;
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, world.store());
  const int rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), world.rank()) - ranks.begin());
  return c10::make_intrusive<NcclGroup>(store, rank, static_cast<int>(ranks.size()), options);
}

}  // namespace push::compat
#endif

// CUDA streams and events (built against a CUDA LibTorch: PUSH_WITH_CUDA). The event class
// moved from ATen (at::cuda::CUDAEvent) to c10 (c10::cuda::CUDAEvent) during 2.x.
#if PUSH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#if __has_include(<c10/cuda/CUDAEvent.h>)
#include <c10/cuda/CUDAEvent.h>
namespace push::compat {
using CudaEvent = c10::cuda::CUDAEvent;
}  // namespace push::compat
#else
#include <ATen/cuda/CUDAEvent.h>
namespace push::compat {
using CudaEvent = at::cuda::CUDAEvent;
}  // namespace push::compat
#endif
#endif
