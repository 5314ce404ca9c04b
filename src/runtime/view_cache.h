#pragma once
// The view cache of one device lane: the last `capacity` views this device took of other
// particles, keyed by particle and validated by the particle's version, so a get() of a
// particle that has not run since is answered without copying. Lane thread only, except
// the stats.
#include <push/core/future.h>
#include <push/runtime/view.h>

#include <atomic>
#include <list>
#include <optional>

namespace push::detail {

class ViewCache {
 public:
  explicit ViewCache(int capacity) : capacity_(capacity) {}

  std::optional<Future<ParticleView>> lookup(Pid pid, uint64_t version);
  void insert(Pid pid, uint64_t version, Future<ParticleView> view);
  /// The view of `pid` kept here, whatever its version, counting neither hit nor miss (a
  /// particle of another rank: its owner says whether the view is still current).
  std::optional<Future<ParticleView>> peek(Pid pid);
  void count_hit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  void count_miss() { misses_.fetch_add(1, std::memory_order_relaxed); }
  /// Forgets every view (a load re-creates particles, whose versions start again).
  void clear() { entries_.clear(); }

  int64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  int64_t misses() const { return misses_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    Pid pid;
    uint64_t version;
    Future<ParticleView> view;
  };
  int capacity_;
  std::list<Entry> entries_;  // front: most recently used
  std::atomic<int64_t> hits_{0};
  std::atomic<int64_t> misses_{0};
};

}  // namespace push::detail
