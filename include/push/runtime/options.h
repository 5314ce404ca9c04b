#pragma once
// The options of a distribution (PushOptions: lanes, the particle cache, threads, seeds,
// a World to span ranks) and of each particle (ParticleOptions: its optimizer, scheduler,
// handlers, device), in LibTorch's builder style (TORCH_ARG).
#include <torch/arg.h>

#include <push/dist/world.h>
#include <push/runtime/types.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>

namespace push {

/// Where particles created without an explicit device go.
enum class Placement {
  /// Particle p on lane p % lanes (with a world: global lane p % all lanes), fixed by the
  /// id alone.
  round_robin,
  /// On the lane whose particles hold the fewest parameter and buffer bytes so far (ties:
  /// the lowest lane), for particles of different sizes. Decided as each particle is
  /// created (they come one at a time, so no placement of all of them at once, as
  /// push::parallel::ModelAssigner makes, is possible). One process only.
  by_size,
};

/// Options of a distribution: `PushOptions().devices(2).cache_size(4)`.
struct PushOptions {
  /// Number of device lanes. On GPUs: the first n (default: all of them); on the CPU:
  /// n event loops (default 1).
  TORCH_ARG(std::optional<int>, devices) = std::nullopt;
  /// What the lanes run on: torch::kCUDA (GPUs) or torch::kCPU. Default: the GPUs when
  /// this process sees any, else the CPU. kCUDA where there is no GPU (or push was built
  /// against a LibTorch without CUDA) is a push::Error saying which.
  TORCH_ARG(std::optional<torch::DeviceType>, device_type) = std::nullopt;
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
  /// hash(seed, p), independent of creation order across devices and ranks.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Spans every rank of this World: each rank runs its own lanes, particle ids are
  /// global, and send/get/p_launch reach particles on any rank. Building the
  /// distribution, p_create, save, load, barrier and destroying it are then collective
  /// (every rank makes them, in the same order); docs/distributed.md lists the rules.
  TORCH_ARG(std::optional<dist::World>, world) = std::nullopt;
  /// Lanes of particles created without ParticleOptions::device.
  TORCH_ARG(Placement, placement) = Placement::round_robin;
};

/// Options of one particle: `ParticleOptions().optimizer(f).on("train", h)`.
struct ParticleOptions {
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  TORCH_ARG(SchedulerFactory, scheduler) = nullptr;
  /// Lane index (on the particle's rank); default: see `rank`.
  TORCH_ARG(std::optional<int>, device) = std::nullopt;
  /// With a world, the rank the particle lives on. Default: particle p goes to global
  /// lane p % (lanes of all ranks), lanes numbered rank by rank (rank 0's first); with
  /// only `device` set, that lane of the default rank; with only `rank` set, lane
  /// p % (that rank's lanes). Without a world: rank 0, lane `device` or p % lanes.
  TORCH_ARG(std::optional<int>, rank) = std::nullopt;
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
