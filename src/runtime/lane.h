#pragma once
// A device lane: an EventLoop (core/event_loop.h) that owns one device's particles, their
// cache and a view cache. Other threads only post jobs to it.
//
// What a lane adds to the loop is particle-specific:
//  - a particle's receive handler is a fiber job whose owner is its ParticleRecord; the
//    handler pins its particle in the cache while it runs, and the lane unpins it while
//    the handler is suspended in a wait (a thousand waiting handlers must not need a
//    thousand resident particles) and re-pins it, restoring it if needed, on resume;
//  - its thread runs with the lane's device current and its own intra-op thread count.
// Only one fiber runs at a time, so NN work on a device is serialized; handlers on one
// device interleave exactly at their wait() points; lanes run in parallel.
#include <torch/types.h>

#include <algorithm>
#include <utility>

#include <cstddef>
#include <string>
#include <vector>

#include "core/event_loop.h"
#include "runtime/lane_streams.h"
#include "runtime/particle_cache.h"
#include "runtime/view_cache.h"

namespace push::detail {

struct ParticleRecord;

struct LaneConfig {
  int index = 0;
  torch::Device device = torch::kCPU;
  int cache_size = 4;
  int view_size = 4;
  int intra_op_threads = 1;
  /// OpenBLAS's thread count. Its pool is one per process, shared by every lane: with
  /// several lanes, 1 (each lane runs BLAS on its own thread); with one, intra_op_threads.
  int blas_threads = 1;
  std::size_t stack_size = std::size_t{1} << 20;
};

class Lane final : public EventLoop {
 public:
  explicit Lane(LaneConfig config);
  ~Lane() override;

  /// Runs `handler` in a fiber with `record` as the running particle. Thread-safe.
  void post_handler(ParticleRecord& record, std::function<void()> handler, Cancel cancel) {
    post_fiber(std::move(handler), std::move(cancel), &record);
  }

  int index() const { return config_.index; }
  const torch::Device& device() const { return config_.device; }
  ParticleCache& cache() { return cache_; }
  const ParticleCache& cache() const { return cache_; }
  ViewCache& views() { return views_; }
  const ViewCache& views() const { return views_; }

  /// The lane whose thread this is, or nullptr (also on another kind of event loop).
  static Lane* current();
  /// The particle whose handler is running now on this lane (lane thread only).
  ParticleRecord* running() const { return static_cast<ParticleRecord*>(running_owner()); }

  /// Pins / unpins the running handler's particle (lane thread only). Pinning bumps the
  /// particle's version: its state may change from here on (see ViewCache).
  void pin_running();
  void unpin_running();

  /// Particles lent to the running handler by Particle::borrow (lane thread only): they
  /// may be used from that handler until the borrow returns.
  void lend(std::vector<ParticleRecord*> records) {
    borrower_ = running();
    borrowed_ = std::move(records);
  }
  void take_back() {
    borrower_ = nullptr;
    borrowed_.clear();
  }
  bool lending() const { return !borrowed_.empty(); }
  bool lends(const ParticleRecord* record) const {
    return borrower_ != nullptr && borrower_ == running() &&
           std::find(borrowed_.begin(), borrowed_.end(), record) != borrowed_.end();
  }

 private:
  void thread_main() override;
  void on_suspend(void* owner) override { unpin_running(); }
  void on_resume(void* owner) override { pin_running(); }
  void check_may_wait(void* owner) override;
  std::string describe_job(void* owner) const override;

  LaneConfig config_;
  LaneStreams streams_;  // before the cache, which copies on them
  ParticleCache cache_;
  ViewCache views_;
  // The particle the running handler has pinned (lane thread only). One is enough: only
  // one fiber runs, and a handler unpins its particle before it suspends.
  ParticleRecord* pinned_ = nullptr;
  ParticleRecord* borrower_ = nullptr;
  std::vector<ParticleRecord*> borrowed_;
};

}  // namespace push::detail
