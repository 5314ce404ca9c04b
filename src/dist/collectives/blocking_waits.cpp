#include "dist/collectives/blocking_waits.h"

#include <exception>

namespace push::dist::detail {

BlockingWaits& BlockingWaits::instance() {
  static BlockingWaits waits;
  return waits;
}

BlockingWaits::~BlockingWaits() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Future<bool> BlockingWaits::run(std::function<void()> wait) {
  Promise<bool> promise;
  auto future = promise.future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(wait), std::move(promise));
    if (idle_ == 0 && static_cast<int>(threads_.size()) < kMaxThreads) {
      ++idle_;  // counted idle until it takes its first job
      threads_.emplace_back([this] { loop(); });
    }
  }
  cv_.notify_one();
  return future;
}

void BlockingWaits::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    auto job = std::move(queue_.front());
    queue_.pop_front();
    --idle_;
    lock.unlock();
    std::exception_ptr error;
    try {
      job.first();
    } catch (...) {
      error = std::current_exception();
    }
    // Drop what the wait captured (the work, and through it Gloo's buffers and context)
    // before the waiter resumes: released later, here, it could outlive the World the
    // waiter goes on to destroy.
    job.first = nullptr;
    if (error)
      job.second.set_error(error);
    else
      job.second.set_value(true);
    lock.lock();
    ++idle_;
  }
}

}  // namespace push::dist::detail
