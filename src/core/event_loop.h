#pragma once
// A fiber event loop: one OS thread that runs posted jobs one at a time, some of them in
// fibers that may wait on futures without blocking the thread.
//
//   auto loop = std::make_shared<EventLoop>(EventLoop::Options{.name = "push-rpc"});
//   loop->start();
//   Promise<int> result;
//   loop->post_fiber([result, other] { result.set_value(other.wait() + 1); },
//                    [result](std::exception_ptr e) { result.set_error(e); });
//   result.future().wait();  // another thread blocks; other.wait() above suspended
//                            // only its fiber (other: a Future<int>)
//   loop->stop();                // cancels queued jobs, unwinds waiting fibers, joins
//
// Jobs are of three kinds:
//  - inline: short work run on the loop's own stack; it must not wait (Future::wait()
//    throws there rather than block the loop that would complete the future).
//  - fiber: run in a fiber (a stackful coroutine); Future::wait() and wait_for() inside it
//    suspend the fiber and let the loop run other jobs, the awaited one included.
//  - resume: a suspended fiber whose awaited future completed (posted by the future).
// A fiber waiting with a deadline (wait_for) also sits in the loop's timer queue: the loop
// sleeps at most until the nearest deadline and resumes an expired waiter itself. Any
// exception out of a job goes to that job's `cancel` (its future); it never escapes the
// loop. Only one fiber runs at a time; fibers interleave exactly at their waits.
//
// post_inline(), post_fiber(), stop() and current() are thread-safe; the rest is for the
// loop's own thread.
// Owners of a loop that need per-job state (a device lane pins the running handler's
// particle) subclass it: a fiber job carries an opaque `owner`, handed to the hooks below.
#include <push/core/future.h>

#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/timer_queue.h"

namespace push::detail {

class EventLoop : public std::enable_shared_from_this<EventLoop> {
 public:
  /// Fails a job's future: called instead of the job when the loop stops first, or with
  /// the exception the job let escape.
  using Cancel = std::function<void(std::exception_ptr)>;

  struct Options {
    /// The thread's name (at most 15 characters are kept) and the loop's in messages.
    std::string name = "push-loop";
    /// Whose current device and stream a fiber switch saves (a CUDA lane's); CPU: none.
    c10::Device device = c10::kCPU;
    /// Each fiber's stack (mapped lazily; a guard page below it).
    std::size_t stack_size = std::size_t{1} << 20;
    /// What stopped the loop, as its cancellation errors say it: "[push] <stopped>
    /// before the work started", "... while a handler was waiting".
    std::string stopped = "the event loop was stopped";
  };

  /// Create with std::make_shared: a waiting fiber's resume holds a weak_ptr to its loop.
  explicit EventLoop(Options options);
  /// Stops the loop. A subclass whose hooks use its own members calls stop() in its own
  /// destructor: by the time this one runs, they are gone.
  virtual ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void start();
  /// Stops taking jobs, cancels queued ones, unwinds suspended fibers (their wait()
  /// throws CancelledError), joins. Idempotent; not from the loop's own thread.
  void stop();

  /// Thread-safe. After stop, `cancel` is called at once with a CancelledError instead.
  void post_inline(std::function<void()> run, Cancel cancel);
  /// Thread-safe. What `run` lets escape reaches `cancel`, as for an inline job. `owner`
  /// is handed to the hooks below while the fiber runs.
  void post_fiber(std::function<void()> run, Cancel cancel, void* owner = nullptr);

  /// The loop whose thread this is, or nullptr.
  static EventLoop* current();
  /// The `owner` of the fiber job running now, or nullptr (loop thread only).
  void* running_owner() const;
  const Options& options() const { return options_; }

  /// Fiber side: suspends the running fiber until `future` is ready or `deadline` passes;
  /// true when ready. A completion after the deadline does not resume it again. Throws
  /// CancelledError when the loop is stopping.
  bool suspend_until(FutureCore& future, std::optional<Clock::time_point> deadline);
  /// Fiber side: whether suspend_until() may suspend the running fiber job now (the loop
  /// is not stopping, and the job is not somewhere it must not wait, as in
  /// Particle::borrow). Loop thread only.
  bool fiber_may_wait();

 protected:
  /// The loop thread's body. A subclass may set up per-thread state around run().
  virtual void thread_main() { run(); }
  /// The loop itself: returns once stop() was called and everything is cancelled.
  void run();

  /// Fiber side, around every suspension of a fiber job of `owner` (nullptr: none).
  /// on_resume is not called when the fiber is resumed to be cancelled. What on_resume
  /// throws is thrown from the fiber's wait().
  virtual void on_suspend(void* owner) {}
  virtual void on_resume(void* owner) {}
  /// Fiber side, first thing in every wait of a fiber job: throws when it must not wait.
  virtual void check_may_wait(void* owner) {}
  /// Fiber side: whether work other than the running fiber waits for this loop's thread
  /// (a queued job or resume, a timer due, stop()); a fiber looking for a value it expects
  /// soon (Promise::expect_within) stops looking then. A subclass that keeps work of its
  /// own adds it.
  virtual bool has_other_work() const;
  /// Names a fiber job in errors, e.g. "a handler of particle 3".
  virtual std::string describe_job(void* owner) const { return "a fiber job"; }

 private:
  struct Task;  // a fiber and the job it runs
  struct Job {
    enum class Kind { kInline, kFiber, kResume };
    Kind kind = Kind::kInline;
    std::function<void()> run;  // inline, fiber
    Cancel cancel;              // inline, fiber
    void* owner = nullptr;      // fiber
    Task* task = nullptr;       // resume
    uint64_t ticket = 0;        // resume: which wait of `task` completed
  };

  void post(Job job);
  void run_guarded(Job& job);
  void run_fiber_body(Task& task);
  void report(Cancel* cancel, const std::exception_ptr& error);
  void dispatch(Job& job);
  void fire_timers();
  void cancel_timer(Task* task);
  void run_task(Task* task);
  void run_task_guarded(Task* task);
  Task* take_task();
  void recycle(Task* task);
  void cancel_suspended();
  void remove_suspended(Task* task);

  Options options_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::atomic<std::size_t> queued_{0};   // queue_.size(), for has_other_work()
  std::atomic<bool> stop_asked_{false};  // stop() was called, for has_other_work()
  bool stop_requested_ = false;
  bool closed_ = false;  // jobs posted now are cancelled
  std::thread thread_;

  // Loop thread only.
  std::vector<std::unique_ptr<Task>> tasks_;
  std::vector<Task*> idle_tasks_;
  std::vector<Task*> suspended_;
  TimerQueue<Task*> timers_;  // suspended fibers with a deadline
  Task* current_ = nullptr;
  bool stopping_ = false;
};

/// Whether a push::Future wait on this thread may suspend a fiber rather than block the
/// thread: inside a fiber job of an event loop that may wait now, outside a backward pass
/// (future.h). Code that must not hold a loop's thread for long waits through a future
/// where this is true, and blocks only where it is not.
bool waits_suspend_here();

}  // namespace push::detail
