#include "runtime/registry.h"

#include <push/core/errors.h>

#include <algorithm>
#include <mutex>

#include "core/clock.h"
#include "runtime/peers.h"

namespace push::detail {

Registry::Registry(const Peers* peers, int rank, int lanes, Placement placement)
    : peers_(peers), rank_(rank), lanes_(lanes), placement_(placement), lane_bytes_(static_cast<size_t>(lanes), 0) {}

int Registry::global_lane(int lane) const { return peers_ ? peers_->first_lane(rank_) + lane : lane; }

std::string Registry::describe(int rank) const { return peers_ ? peers_->describe(rank) : c10::str("rank ", rank); }

std::string Registry::unknown_id_text(Pid pid) const {
  if (placements_.empty()) {
    return c10::str("unknown particle id ", pid, " (the distribution has no particles)");
  }
  return c10::str("unknown particle id ", pid, " (the distribution has ", placements_.size(), " particles, ids ",
                  placements_.begin()->first, "..", placements_.rbegin()->first, ")");
}

std::optional<Where> Registry::find(Pid pid) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = placements_.find(pid);
  if (it == placements_.end()) return std::nullopt;
  Where at = it->second;
  if (at.rank == rank_) {
    auto record = records_.find(pid);
    // A particle of this rank is placed when it is added, so its record is there.
    TORCH_INTERNAL_ASSERT(record != records_.end(), "particle ", pid, " placed here without a record");
    at.record = record->second.get();
  }
  return at;
}

Where Registry::where(Pid pid, const char* origin) const {
  if (auto at = find(pid)) return *at;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  throw Error(c10::str("[", origin, "] ", unknown_id_text(pid)));
}

std::vector<Pid> Registry::particle_ids() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<Pid> ids;
  ids.reserve(placements_.size());
  for (const auto& entry : placements_) ids.push_back(entry.first);
  return ids;
}

std::vector<Pid> Registry::local_particle_ids() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<Pid> ids;
  ids.reserve(records_.size());
  for (const auto& entry : records_) ids.push_back(entry.first);
  return ids;
}

int64_t Registry::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return static_cast<int64_t>(placements_.size());
}

std::vector<ParticleRecord*> Registry::records_on(int lane) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<ParticleRecord*> out;
  for (const auto& entry : records_) {
    if (entry.second->lane == lane) out.push_back(entry.second.get());
  }
  return out;
}

Pid Registry::claim_next() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  while (placements_.count(next_pid_) || claimed_.count(next_pid_)) ++next_pid_;
  const Pid pid = next_pid_++;
  claimed_.insert(pid);
  return pid;
}

void Registry::claim(Pid pid, const char* origin) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  PUSH_CHECK(!placements_.count(pid) && !claimed_.count(pid), origin, "particle ", pid,
             claimed_.count(pid) ? " is being created by another call" : " already exists");
  claimed_.insert(pid);
  next_pid_ = std::max(next_pid_, pid + 1);
}

void Registry::release(Pid pid) {
  std::vector<Promise<bool>> waiting;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    claimed_.erase(pid);
    if (records_.count(pid)) return;
    auto it = creation_waiters_.find(pid);
    if (it != creation_waiters_.end()) {
      waiting = std::move(it->second);
      creation_waiters_.erase(it);
    }
  }
  // Requests of other ranks waiting for this particle learn that it will not come.
  for (auto& w : waiting) {
    w.set_error(std::make_exception_ptr(Error(c10::str("particle ", pid, " could not be created on rank ", rank_))));
  }
}

Where Registry::place(Pid pid, const ParticleOptions& options, const char* origin) const {
  if (!peers_) {
    PUSH_CHECK(!options.rank() || *options.rank() == 0, origin, "rank(", *options.rank(),
               ") needs a distribution over a World (PushOptions::world)");
    const int lane = options.device().value_or(static_cast<int>(pid % lanes_));
    PUSH_CHECK(lane >= 0 && lane < lanes_, origin, "device ", lane, " is out of range: the distribution has ", lanes_,
               " device", lanes_ == 1 ? "" : "s", " (0..", lanes_ - 1, ")");
    return Where{0, lane};
  }
  const auto [rank0, lane0] = peers_->global_lane(pid);
  const int rank = options.rank().value_or(rank0);
  PUSH_CHECK(rank >= 0 && rank < peers_->size(), origin, "rank ", rank, " is out of range: the world has ",
             peers_->size(), " ranks");
  const int lanes = peers_->lanes_of(rank);
  const int lane = options.device().value_or(options.rank() ? static_cast<int>(pid % lanes) : lane0);
  PUSH_CHECK(lane >= 0 && lane < lanes, origin, "device ", lane, " is out of range: rank ", rank, " has ", lanes,
             " device", lanes == 1 ? "" : "s", " (0..", lanes - 1, ")");
  return Where{rank, lane};
}

int Registry::lane_for(const Where& at, const ParticleOptions& options) const {
  if (options.device() || placement_ == Placement::round_robin) return at.lane;
  // The lightest lane by the particles added so far (so scratch copies that load builds
  // and failed builds count nothing).
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return static_cast<int>(std::min_element(lane_bytes_.begin(), lane_bytes_.end()) - lane_bytes_.begin());
}

void Registry::add(std::unique_ptr<ParticleRecord> record) {
  std::vector<Promise<bool>> waiting;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const Pid pid = record->pid;
    // The id was claimed by the caller, so no other record can hold it.
    TORCH_INTERNAL_ASSERT(!records_.count(pid), "particle ", pid, " registered twice");
    next_pid_ = std::max(next_pid_, pid + 1);
    placements_[pid] = Where{rank_, record->lane};
    lane_bytes_[static_cast<size_t>(record->lane)] += record->bytes;
    failed_creations_.erase(pid);
    records_.emplace(pid, std::move(record));
    claimed_.erase(pid);
    auto it = creation_waiters_.find(pid);
    if (it != creation_waiters_.end()) {
      waiting = std::move(it->second);
      creation_waiters_.erase(it);
    }
  }
  for (auto& w : waiting) w.set_value(true);
}

void Registry::add_elsewhere(Pid pid, const Where& at) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  placements_[pid] = Where{at.rank, at.lane};
  next_pid_ = std::max(next_pid_, pid + 1);
  claimed_.erase(pid);
}

void Registry::mark_failed(Pid pid, std::string why) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  failed_creations_[pid] = std::move(why);
}

ParticleRecord& Registry::await_local(Pid pid, std::chrono::milliseconds timeout, const char* origin) {
  const auto deadline = Clock::deadline_after(timeout);
  while (true) {
    Future<bool> created;
    {
      std::unique_lock<std::shared_mutex> lock(mutex_);
      auto it = records_.find(pid);
      if (it != records_.end()) return *it->second;
      auto failed = failed_creations_.find(pid);
      if (failed != failed_creations_.end()) {
        throw Error(c10::str("[", origin, "] particle ", pid, " could not be created on ", describe(rank_), ": ",
                             failed->second));
      }
      auto placed = placements_.find(pid);
      PUSH_CHECK(placed == placements_.end() || placed->second.rank == rank_, origin, "particle ", pid, " lives on ",
                 describe(placed->second.rank), " by this rank's count, not on ", describe(rank_),
                 ": the ranks did not make the same p_create calls");
      // Another rank created it already; this one is about to (p_create is collective).
      Promise<bool> promise;
      created = promise.future();
      creation_waiters_[pid].push_back(std::move(promise));
    }
    const auto left = deadline - Clock::now();
    if (left <= decltype(left)::zero() || !created.wait_for(left)) {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      throw Error(c10::str("[", origin, "] ", unknown_id_text(pid), " on ", describe(rank_),
                           ": not created here within ", timeout.count(),
                           " ms (rpc_timeout); every rank must make the same p_create calls"));
    }
  }
}

void add_particle(Lanes& lanes, Registry& registry, std::unique_ptr<ParticleRecord> record) {
  ParticleRecord* raw = record.get();
  lanes
      .call<bool>(raw->lane,
                  [&lanes, raw] {
                    lanes.at(raw->lane).cache().insert(*raw);
                    return true;
                  })
      .wait();
  registry.add(std::move(record));
}

}  // namespace push::detail
