#pragma once
#include <torch/arg.h>

#include <push/runtime/types.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>

namespace push {

/// Options of a distribution: `PushOptions().devices(2).cache_size(4)`.
struct PushOptions {
  /// Number of device lanes. With CUDA: the first n GPUs (default: all of them);
  /// without: n CPU lanes (default 1), each with its own event loop.
  TORCH_ARG(std::optional<int>, devices) = std::nullopt;
  /// Most particles resident (materialized on the device) per device. The rest live in
  /// a host store with their gradients and optimizer state.
  TORCH_ARG(int, cache_size) = 4;
  /// Most parameter views of other particles kept per device.
  TORCH_ARG(int, view_size) = 4;
  /// Intra-op threads of each lane; default max(1, cores / lanes), so that
  /// lanes x intra-op threads <= cores.
  TORCH_ARG(std::optional<int>, intra_op_threads) = std::nullopt;
  /// Stack of each suspended handler (only touched pages are committed).
  TORCH_ARG(std::size_t, stack_size) = std::size_t{1} << 20;
  /// Seed of particles created without an explicit one: particle p gets
  /// hash(seed, p), independent of creation order across devices.
  TORCH_ARG(uint64_t, seed) = 0;
};

/// Options of one particle: `ParticleOptions().optimizer(f).on("train", h)`.
struct ParticleOptions {
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  TORCH_ARG(SchedulerFactory, scheduler) = nullptr;
  /// Lane index; default pid % number of lanes.
  TORCH_ARG(std::optional<int>, device) = std::nullopt;
  /// Receive handlers, message name -> handler.
  TORCH_ARG(Handlers, receive) = {};
  TORCH_ARG(State, state) = {};
  /// Seed of the network's initialisation; default derived from PushOptions::seed and pid.
  TORCH_ARG(std::optional<uint64_t>, seed) = std::nullopt;

 public:
  /// Adds one receive handler.
  ParticleOptions& on(std::string message, Handler handler) {
    receive_[std::move(message)] = std::move(handler);
    return *this;
  }
};

}  // namespace push
