#pragma once
// SimpleQueue: a multi-producer multi-consumer queue of values (machin's SimpleQueue), in
// one process (push::server::QueueHost hosts one for the members of an RpcGroup).
//
//   push::parallel::SimpleQueue<int> q;
//   q.put(1);
//   std::optional<int> v = q.get(std::chrono::milliseconds(100));  // nothing on timeout
//   q.close();        // puts now fail; gets drain what is left, then fail
//
// get() waits as push's futures do: inside a fiber (a particle handler, an RPC handler, a
// ThreadPool task) it suspends the fiber, not the thread. A get on a closed, empty queue
// throws push::Error ("closed"); so does a put on a closed queue. Values come out in the
// order they went in; waiting getters are served in the order they started waiting.
#include <push/core/errors.h>
#include <push/core/future.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace push::parallel {

template <class T>
class SimpleQueue {
 public:
  /// Appends `value`, or hands it to the longest-waiting get(); push::Error when closed.
  void put(T value) {
    std::shared_ptr<Promise<T>> waiter;
    {
      std::lock_guard lock(mutex_);
      PUSH_CHECK(!closed_, "push::parallel::SimpleQueue", "put on a closed queue");
      if (waiters_.empty()) {
        items_.push_back(std::move(value));
        return;
      }
      waiter = std::move(waiters_.front());
      waiters_.pop_front();
    }
    waiter->set_value(std::move(value));
  }

  /// The oldest value, waiting at most `timeout` for one (nothing when it passes);
  /// push::Error once the queue is closed and empty.
  std::optional<T> get(std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) {
    std::shared_ptr<Promise<T>> waiter;  // its address tells this get's place in the line
    {
      std::lock_guard lock(mutex_);
      if (!items_.empty()) {
        T value = std::move(items_.front());
        items_.pop_front();
        return value;
      }
      PUSH_CHECK(!closed_, "push::parallel::SimpleQueue", "get on a closed, empty queue");
      if (timeout.count() <= 0) return std::nullopt;
      waiter = std::make_shared<Promise<T>>();
      waiters_.push_back(waiter);
    }
    Future<T> future = waiter->future();
    bool ready = false;
    try {
      ready = future.wait_for(timeout);
    } catch (...) {
      // The wait itself failed (its fiber's loop is stopping): give back what a put may
      // have handed over meanwhile, so that no value is lost, then fail.
      std::lock_guard lock(mutex_);
      auto it = std::find(waiters_.begin(), waiters_.end(), waiter);
      if (it != waiters_.end()) {
        waiters_.erase(it);
      } else if (future.is_ready() && !future.has_error()) {
        items_.push_front(future.wait());
      }
      throw;
    }
    if (!ready) {
      std::lock_guard lock(mutex_);
      auto it = std::find(waiters_.begin(), waiters_.end(), waiter);
      if (it != waiters_.end()) {  // still waiting: nobody will fill it now
        waiters_.erase(it);
        return std::nullopt;
      }
      // A put (or close) filled it just as the wait ended: take what it left.
    }
    return future.wait();
  }

  /// Non-blocking get.
  std::optional<T> try_get() { return get(std::chrono::milliseconds(0)); }

  bool empty() const {
    std::lock_guard lock(mutex_);
    return items_.empty();
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return items_.size();
  }
  /// How many get()s wait for a value now.
  size_t waiting() const {
    std::lock_guard lock(mutex_);
    return waiters_.size();
  }
  /// Puts fail from now on; waiting gets fail at once; values already in stay gettable.
  void close() {
    std::deque<std::shared_ptr<Promise<T>>> waiters;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      waiters.swap(waiters_);
    }
    for (auto& w : waiters) {
      w->set_error(std::make_exception_ptr(Error("[push::parallel::SimpleQueue] get on a closed, empty queue")));
    }
  }
  bool closed() const {
    std::lock_guard lock(mutex_);
    return closed_;
  }

 private:
  mutable std::mutex mutex_;
  std::deque<T> items_;
  std::deque<std::shared_ptr<Promise<T>>> waiters_;
  bool closed_ = false;
};

}  // namespace push::parallel
