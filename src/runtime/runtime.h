#pragma once
// The internals behind push::Push, put together: the device lanes, the registry of
// particles, the builder that makes them, their delivery (to this rank's lanes, or over
// Peers to other ranks), the collectives of the ranks and checkpoints. Each of those is
// its own class; this one owns them, wires them, and routes a request for a particle to
// the rank it lives on.
#include <push/core/future.h>
#include <push/runtime/options.h>
#include <push/runtime/view.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/checkpointer.h"
#include "runtime/collectives.h"
#include "runtime/lanes.h"
#include "runtime/local_delivery.h"
#include "runtime/particle_builder.h"
#include "runtime/peers.h"
#include "runtime/registry.h"
#include "runtime/remote_delivery.h"

namespace push::detail {

class Runtime {
 public:
  Runtime(ModuleFactory factory, PushOptions options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Cancels pending work, unwinds suspended handlers, joins every lane. Idempotent.
  /// Not on one of this runtime's own lanes (a lane cannot join itself). With a world it
  /// first meets the other ranks (collective), serving their requests meanwhile.
  void shutdown();
  /// Refuses new work at once (p_create, p_launch, save, load throw CancelledError).
  void close() { stopping_.store(true); }

  Lanes& lanes() { return lanes_; }
  const Lanes& lanes() const { return lanes_; }
  const Registry& registry() const { return registry_; }
  Collectives& collectives() { return collectives_; }
  int rank() const { return registry_.rank(); }
  int world_size() const { return peers_ ? peers_->size() : 1; }

  /// Creates particle `pid` (default: the next free id); collective with a world.
  Pid create(const ParticleOptions& options, std::optional<Pid> pid = std::nullopt);
  /// Runs `pid`'s handler for `message`, on whichever rank it lives.
  PFuture send(Pid pid, const std::string& message, Args args, const char* origin);
  /// A view of `pid` for the handler of `caller`, running on `lane` (Particle::get).
  Future<ParticleView> view(Pid pid, const ParticleRecord& caller, Lane& lane, const char* origin);
  /// A copy of `pid`'s parameters on the CPU (Push::p_parameters).
  ParticleView::Data parameters(Pid pid, const char* origin);

  void save(const std::filesystem::path& dir, const std::optional<std::set<Pid>>& only, const char* origin);
  std::vector<Pid> load(const std::filesystem::path& dir, const std::function<ParticleOptions(Pid)>& make_options,
                        bool whole, const char* origin);

 private:
  void check_open(const char* origin) const;

  const PushOptions options_;
  std::shared_ptr<Peers> peers_;  // null without a world
  Lanes lanes_;
  Registry registry_;
  ParticleBuilder builder_;
  LocalDelivery local_;
  std::optional<RemoteDelivery> remote_;  // with a world
  Collectives collectives_;
  Checkpointer checkpointer_;
  std::atomic<bool> stopping_{false};
};

}  // namespace push::detail
