#pragma once
// Runs blocking waits on threads of their own, so that a fiber can await them: Gloo's
// send/recv work has no future to be called back from and completes only inside its own
// wait(). A fiber hands the wait here and suspends on the returned future; its lane goes on
// running other fibers. The threads are started on demand, at most kMaxThreads (more waits
// queue: each is bounded by its own timeout, and Gloo moves the data whether or not anyone
// waits, so a queued wait is only noticed later, never stuck), and joined at exit.
#include <push/core/future.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace push::dist::detail {

class BlockingWaits {
 public:
  static constexpr int kMaxThreads = 8;
  static BlockingWaits& instance();
  ~BlockingWaits();

  /// Runs `wait` on a waiting thread; the future completes when it returns (or fails
  /// with what it threw).
  Future<bool> run(std::function<void()> wait);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, Promise<bool>>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace push::dist::detail
