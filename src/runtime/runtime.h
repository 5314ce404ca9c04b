#pragma once
// The internals behind push::Push: the device lanes and the particle registry.
#include <push/core/errors.h>
#include <push/core/future.h>
#include <push/runtime/options.h>
#include <push/runtime/view.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "runtime/lane.h"
#include "runtime/particle_record.h"
#include "runtime/peers.h"

namespace push::detail {

/// An exception from particle code, rewrapped with the particle and message in its text.
std::exception_ptr wrap_particle_error(Pid pid, const std::string& message,
                                       std::exception_ptr error);

/// Where a particle lives: its rank (0 without a world) and its lane there, and its record
/// when it lives on this rank (records are never removed, so the pointer stays valid).
struct Where {
  int rank = 0;
  int lane = 0;
  ParticleRecord* record = nullptr;
};

/// One particle's line in a checkpoint's manifest (checkpoint.cpp).
struct ManifestEntry {
  Pid pid = -1;
  int lane = 0;
  int64_t scheduler_steps = 0;
  uint64_t bytes = 0;  // of the particle file
  uint32_t crc = 0;    // CRC-32C of the particle file
};

class Runtime {
 public:
  Runtime(ModuleFactory factory, PushOptions options);
  ~Runtime();

  /// Cancels pending work, unwinds suspended handlers, joins every lane. Idempotent.
  /// Not on one of this runtime's own lanes (a lane cannot join itself). With a world it
  /// first meets the other ranks (collective), serving their requests meanwhile.
  void shutdown();
  /// Refuses new work at once (p_create, p_launch, save, load throw CancelledError).
  void close() { stopping_.store(true); }

  /// Whether this thread is one of this runtime's lanes (e.g. inside one of its handlers).
  bool on_own_lane() const;

  int num_lanes() const { return static_cast<int>(lanes_.size()); }
  Lane& lane(int index) { return *lanes_.at(static_cast<size_t>(index)); }
  const Lane& lane(int index) const { return *lanes_.at(static_cast<size_t>(index)); }

  /// Where `pid` lives (one lookup: `record` is set for a particle of this rank); throws
  /// push::Error naming `origin` for an unknown id.
  Where where(Pid pid, const char* origin) const;
  /// Every particle of the distribution (all ranks), ascending.
  std::vector<Pid> particle_ids() const;
  /// The particles of this rank, ascending.
  std::vector<Pid> local_particle_ids() const;
  int64_t num_particles() const;
  int rank() const { return rank_; }
  /// Lane `lane` of this rank in the numbering of every rank's lanes (rank 0's first).
  int global_lane(int lane) const { return peers_ ? peers_->first_lane(rank_) + lane : lane; }
  int world_size() const { return peers_ ? peers_->size() : 1; }
  /// The link to the other ranks; null without a world.
  Peers* peers() const { return peers_.get(); }
  const PushOptions& options() const { return options_; }

  Pid create(const ParticleOptions& options, std::optional<Pid> pid = std::nullopt);
  /// A particle built from `options` (module, optimizer, scheduler, handlers) but not yet
  /// in the distribution: nothing can address it. Any thread.
  std::unique_ptr<ParticleRecord> build_record(const ParticleOptions& options, Pid pid,
                                               const char* origin);
  /// Puts a built particle into its lane's cache, then into the registry.
  void register_record(std::unique_ptr<ParticleRecord> record);
  /// Claims `pid` for a record about to be built (throws if it exists or is claimed);
  /// release_pid gives back a claim whose record was never registered.
  void reserve_pid(Pid pid, const char* origin);
  void release_pid(Pid pid);

  /// Runs `pid`'s handler for `message` on its lane.
  PFuture send(Pid pid, const std::string& message, Args args, const char* origin, bool from_peer = false);

  /// Runs `fn` on lane `lane`'s loop (at once if this thread is that lane).
  template <class T>
  Future<T> call_on_lane(int lane, std::function<T()> fn);

  /// A copy of `record`'s parameters and gradients on `device`. On the record's lane.
  ParticleView::Data snapshot(ParticleRecord& record, const torch::Device& device);

  // Particles of other ranks (remote.cpp).
  PFuture send_remote(Pid pid, const Where& where, const std::string& message, Args args);
  /// A view of `pid` (on another rank) for a handler on `caller`: one round trip, which
  /// carries the parameters only when the cached view is out of date.
  Future<ParticleView> view_remote(Pid pid, const Where& where, Lane& caller);
  ParticleView::Data parameters_remote(Pid pid, const Where& where);
  /// Answers a request of another rank (an RPC handler fiber).
  c10::IValue serve(PeerOp op, const dist::RpcArgs& body);
  /// Collective with a world (every rank meets; none: nothing to do).
  void barrier(const char* origin);
  /// Collective: Peers::all_gather of `step`, which must match on every rank together
  /// with the number of particles (ranks whose p_create calls diverged fail here).
  std::vector<c10::IValue> gather(c10::IValue value, const std::string& step, const char* origin);

  void save(const std::filesystem::path& dir);
  void load(const std::filesystem::path& dir,
            const std::function<ParticleOptions(Pid)>& make_options);

 private:
  void check_open(const char* origin) const;
  // Checkpoints (checkpoint.cpp).
  /// With a world: every rank learns whether every rank's step succeeded; all throw (this
  /// rank's own error first) or none does. Without: rethrows `failure`.
  void agree(std::exception_ptr failure, const std::string& step, const char* origin);
  std::filesystem::path stage_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& target);
  std::vector<ManifestEntry> write_particles(const std::filesystem::path& staged);
  std::vector<ParticleRecord*> records_on(int lane) const;
  /// Where a new particle goes (see ParticleOptions::rank).
  Where place(Pid pid, const ParticleOptions& options, const char* origin) const;
  /// The particle `pid` of this rank, waiting (in an RPC handler) for this rank to create
  /// it when another rank already did.
  ParticleRecord& await_local(Pid pid, const char* origin);
  std::string unknown_id_text(Pid pid) const;  // mutex_ held

  ModuleFactory factory_;
  PushOptions options_;
  std::vector<int64_t> lane_bytes_;  // parameter and buffer bytes of the particles built on each lane
  std::vector<std::shared_ptr<Lane>> lanes_;
  mutable std::shared_mutex mutex_;
  std::map<Pid, std::unique_ptr<ParticleRecord>> records_;  // this rank's particles
  std::map<Pid, Where> placements_;                         // every rank's particles
  // Requests of other ranks for particles this rank has not created yet.
  std::map<Pid, std::vector<Promise<bool>>> creation_waiters_;
  // Particles this rank failed to create (the other ranks placed them here): id -> why.
  std::map<Pid, std::string> failed_creations_;
  // Ids handed out (by create or load) whose records are being built: no one else may
  // take them meanwhile. Guarded by mutex_.
  std::set<Pid> reserved_;
  Pid next_pid_ = 0;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<Peers> peers_;
  int rank_ = 0;
};

template <class T>
Future<T> Runtime::call_on_lane(int lane, std::function<T()> fn) {
  auto state = std::make_shared<FutureState<T>>();
  auto run = [state, fn = std::move(fn)] {
    try {
      state->set_value(fn());
    } catch (...) {
      state->set_error(std::current_exception());
    }
  };
  Lane& target = this->lane(lane);
  if (Lane::current() == &target) {
    run();
  } else {
    target.post_inline(std::move(run),
                       [state](std::exception_ptr e) { state->set_error(std::move(e)); });
  }
  return Future<T>(std::move(state));
}

}  // namespace push::detail
