#pragma once
// A device lane: one OS thread running an event loop that owns one device's particles,
// their cache and a view cache. Other threads only post jobs to it.
//
// Jobs are of three kinds:
//  - inline: short runtime work (a view snapshot, a checkpoint write) run on the lane's
//    own stack; it never waits.
//  - handler: a particle's receive handler, run in a fiber (a stackful coroutine), with
//    its particle pinned in the cache while it runs.
//  - resume: a suspended handler whose awaited future completed.
// A handler waiting with a deadline (wait_for) also sits in the lane's timer queue: the
// loop sleeps at most until the nearest deadline and resumes an expired waiter itself.
// Any exception out of a job fails that job's future; it never escapes the loop.
// Only one fiber runs at a time, so NN work on a device is serialized; handlers on one
// device interleave exactly at their wait() points; lanes run in parallel.
#include <push/core/future.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/fiber.h"
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

class Lane : public std::enable_shared_from_this<Lane> {
 public:
  using Clock = std::chrono::steady_clock;
  struct Task;  // a fiber and what it is running

  struct Job {
    enum class Kind { kInline, kHandler, kResume };
    Kind kind = Kind::kInline;
    std::function<void()> run;                       // inline, handler
    std::function<void(std::exception_ptr)> cancel;  // inline, handler: fail its future
    ParticleRecord* owner = nullptr;                 // handler: its particle
    Task* task = nullptr;                            // resume
    uint64_t ticket = 0;                             // resume
  };

  explicit Lane(LaneConfig config);
  ~Lane();

  void start();
  /// Thread-safe. After stop, the job is cancelled at once instead.
  void post(Job job);
  /// Stops taking jobs, cancels queued ones, unwinds suspended handlers, joins.
  void stop();

  int index() const { return config_.index; }
  const torch::Device& device() const { return config_.device; }
  ParticleCache& cache() { return cache_; }
  const ParticleCache& cache() const { return cache_; }
  ViewCache& views() { return views_; }
  const ViewCache& views() const { return views_; }

  /// The lane whose thread this is, or nullptr.
  static Lane* current();
  /// The particle whose handler is running now on this lane (lane thread only).
  ParticleRecord* running() const;

  /// Fiber side: suspends the running handler until `future` is ready or `deadline`
  /// passes; true when ready. Unpins its particle meanwhile. A completion after the
  /// deadline does not resume it again. Throws CancelledError when the lane is stopping.
  bool suspend_until(FutureCore& future, std::optional<Clock::time_point> deadline);

  /// Pins / unpins the running handler's particle (lane thread only).
  void pin_running();
  void unpin_running();

 private:
  void loop();
  void run_guarded(Job& job);
  void dispatch(Job& job);
  void fire_timers();
  void cancel_timer(Task* task);
  void run_task(Task* task);
  void run_task_guarded(Task* task);
  Task* take_task();
  void recycle(Task* task);
  void cancel_suspended();
  void remove_suspended(Task* task);

  LaneConfig config_;
  ParticleCache cache_;
  ViewCache views_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_requested_ = false;
  bool closed_ = false;  // jobs posted now are cancelled
  std::thread thread_;

  // Lane thread only.
  std::vector<std::unique_ptr<Task>> tasks_;
  std::vector<Task*> idle_tasks_;
  std::vector<Task*> suspended_;
  std::multimap<Clock::time_point, Task*> timers_;  // suspended handlers with a deadline
  Task* current_ = nullptr;
  bool stopping_ = false;
};

}  // namespace push::detail
