#pragma once
// The OS threads Python handlers run on.
//
// CPython cannot run on push's fiber stacks: a fiber that suspends under a Python frame
// leaves the interpreter's per-thread state pointing into a stack that another fiber then
// runs on. So a message for a Python handler becomes a fiber on the particle's lane that
// hands the call to one of these threads and waits, suspended, for it (handler_bridge.h).
//
// One thread per handler running at a time: a handler that waits on another particle's
// handler holds its thread while the other runs on a second one, so chains and cycles of
// waits never run out of threads. Threads that finish wait for the next handler; all of
// them are joined by close(). Thread-safe. Call close() and the destructor without the GIL.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace push::python {

class HandlerThreads {
 public:
  HandlerThreads() = default;
  ~HandlerThreads();
  HandlerThreads(const HandlerThreads&) = delete;
  HandlerThreads& operator=(const HandlerThreads&) = delete;

  /// A handler's work; it returns what publishes its outcome, which the thread runs once it
  /// counts as idle again, so that the message the outcome lets in (a sequence of calls)
  /// finds this thread rather than starting another. Neither part may throw.
  using Job = std::function<std::function<void()>()>;
  /// Runs `job` on an idle thread, or on a new one when none is idle. Throws after close().
  void run(Job job);
  /// Lets the queued and running jobs finish, then joins every thread. Idempotent.
  void close();
  std::size_t threads() const;

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> jobs_;
  std::size_t idle_ = 0;
  bool closed_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace push::python
