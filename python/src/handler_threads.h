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

  /// Runs `job` on an idle thread, or on a new one when none is idle. Throws after close().
  void run(std::function<void()> job);
  /// Lets the queued and running jobs finish, then joins every thread. Idempotent.
  void close();
  std::size_t threads() const;

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::size_t idle_ = 0;
  bool closed_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace push::python
