#pragma once
// Which particles the distribution has and where each lives: ids (handed out, claimed
// while a particle is built, released when building fails), placement over ranks and
// lanes, and the records of this rank's particles. Thread-safe.
#include <push/core/future.h>
#include <push/runtime/options.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "runtime/lanes.h"
#include "runtime/particle_record.h"

namespace push::detail {

class Peers;

/// Where a particle lives: its rank (0 without a world) and its lane there, and its record
/// when it lives on this rank (records are never removed, so the pointer stays valid).
struct Where {
  int rank = 0;
  int lane = 0;
  ParticleRecord* record = nullptr;
};

class Registry {
 public:
  /// `peers`: the other ranks (null without a world); `lanes`: this rank's lane count.
  Registry(const Peers* peers, int rank, int lanes, Placement placement);

  /// This rank (0 without a world).
  int rank() const { return rank_; }
  /// Whether the distribution spans several ranks (a world).
  bool distributed() const { return peers_ != nullptr; }
  /// Lane `lane` of this rank in the numbering of every rank's lanes (rank 0's first).
  int global_lane(int lane) const;

  /// Where `pid` lives (one lookup: `record` is set for a particle of this rank); throws
  /// push::Error naming `origin` for an unknown id.
  Where where(Pid pid, const char* origin) const;
  /// Where `pid` lives, if it exists; `record` set as for where().
  std::optional<Where> find(Pid pid) const;
  /// Every particle of the distribution (all ranks), ascending.
  std::vector<Pid> particle_ids() const;
  /// The particles of this rank, ascending.
  std::vector<Pid> local_particle_ids() const;
  int64_t size() const;
  /// This rank's particles on `lane`, ascending.
  std::vector<ParticleRecord*> records_on(int lane) const;

  /// The lowest id nobody holds or claims, claimed for the caller.
  Pid claim_next();
  /// Claims `pid` for a record about to be built; throws naming `origin` when it exists or
  /// is claimed.
  void claim(Pid pid, const char* origin);
  /// Gives back a claim whose particle was never added; other ranks waiting for it (see
  /// await_local) learn that it will not come.
  void release(Pid pid);

  /// Where particle `pid` goes (see ParticleOptions::rank and ::device; by size, the lane
  /// is decided by lane_for once it is known to be this rank's).
  Where place(Pid pid, const ParticleOptions& options, const char* origin) const;
  /// The lane of this rank a particle placed at `at` is built on: `at.lane`, or, by size
  /// and without an explicit device, the lane whose particles hold the fewest bytes so far.
  int lane_for(const Where& at, const ParticleOptions& options) const;

  /// Adds a built particle of this rank (its id claimed), waking requests waiting for it.
  void add(std::unique_ptr<ParticleRecord> record);
  /// Adds a particle that another rank holds (its id claimed here too).
  void add_elsewhere(Pid pid, const Where& at);
  /// With a world: remembers why this rank failed to build `pid`, for the other ranks'
  /// requests for it.
  void mark_failed(Pid pid, std::string why);

  /// The particle `pid` of this rank, waiting up to `timeout` (in an RPC handler) for this
  /// rank to create it when another rank already did (p_create is collective).
  ParticleRecord& await_local(Pid pid, std::chrono::milliseconds timeout, const char* origin);

 private:
  std::string unknown_id_text(Pid pid) const;  // mutex_ held
  std::string describe(int rank) const;

  const Peers* peers_;
  const int rank_;
  const int lanes_;
  const Placement placement_;
  mutable std::shared_mutex mutex_;
  std::map<Pid, std::unique_ptr<ParticleRecord>> records_;  // this rank's particles
  std::map<Pid, Where> placements_;                         // every rank's particles
  std::vector<int64_t> lane_bytes_;  // parameter and buffer bytes of the particles added on each lane
  // Requests of other ranks for particles this rank has not created yet.
  std::map<Pid, std::vector<Promise<bool>>> creation_waiters_;
  // Particles this rank failed to create (the other ranks placed them here): id -> why.
  std::map<Pid, std::string> failed_creations_;
  // Ids handed out (by create or load) whose records are being built: no one else may
  // take them meanwhile.
  std::set<Pid> claimed_;
  Pid next_pid_ = 0;
};

/// Puts a built particle (its id claimed) into its lane's cache, on that lane, then into
/// `registry`: no message can reach it before the cache holds it.
void add_particle(Lanes& lanes, Registry& registry, std::unique_ptr<ParticleRecord> record);

}  // namespace push::detail
