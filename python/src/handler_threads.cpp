#include "handler_threads.h"

#include <push/core/errors.h>

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace push::python {

HandlerThreads::~HandlerThreads() { close(); }

void HandlerThreads::run(Job job) {
  std::lock_guard<std::mutex> lock(mutex_);
  PUSH_CHECK(!closed_, "push.PusH", "the distribution is closed");
  jobs_.push_back(std::move(job));
  if (idle_ >= jobs_.size()) {
    ready_.notify_one();
  } else {
    threads_.emplace_back([this] { loop(); });
  }
}

void HandlerThreads::loop() {
  // The thread's interpreter state lives as long as the thread: made once here, not on
  // every handler.
  py::gil_scoped_acquire gil;
  py::gil_scoped_release unlocked;
  std::unique_lock<std::mutex> lock(mutex_);
  ++idle_;
  for (;;) {
    ready_.wait(lock, [&] { return closed_ || !jobs_.empty(); });
    if (jobs_.empty()) {  // closed, and nothing left to run
      --idle_;
      return;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    --idle_;
    lock.unlock();
    std::function<void()> publish = job();
    job = nullptr;
    lock.lock();
    ++idle_;  // before the outcome is out: a job it lets in may take this thread
    lock.unlock();
    publish();
    publish = nullptr;
    lock.lock();
  }
}

void HandlerThreads::close() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    threads.swap(threads_);
  }
  ready_.notify_all();
  for (std::thread& t : threads) t.join();
}

std::size_t HandlerThreads::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return threads_.size();
}

}  // namespace push::python
