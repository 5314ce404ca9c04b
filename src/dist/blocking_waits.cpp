#include "blocking_waits.h"

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
    try {
      job.first();
      job.second.set_value(true);
    } catch (...) {
      job.second.set_error(std::current_exception());
    }
    lock.lock();
    ++idle_;
  }
}

}  // namespace push::dist::detail
