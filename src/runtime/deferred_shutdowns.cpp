#include "runtime/deferred_shutdowns.h"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/runtime.h"

namespace push::detail {
namespace {

class DeferredShutdowns {
 public:
  static DeferredShutdowns& instance() {
    static DeferredShutdowns shutdowns;
    return shutdowns;
  }

  void start(std::shared_ptr<Runtime> runtime) {
    std::lock_guard<std::mutex> lock(mutex_);
    join_finished();
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([runtime = std::move(runtime), done]() mutable {
                          pthread_setname_np(pthread_self(), "push-shutdown");
                          runtime->shutdown();
                          runtime.reset();
                          done->store(true, std::memory_order_release);
                        }),
                        done});
  }

  ~DeferredShutdowns() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& t : threads_) t.thread.join();
  }

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void join_finished() {
    std::erase_if(threads_, [](Entry& t) {
      if (!t.done->load(std::memory_order_acquire)) return false;
      t.thread.join();
      return true;
    });
  }
  std::mutex mutex_;
  std::vector<Entry> threads_;
};

}  // namespace

void shut_down_later(std::shared_ptr<Runtime> runtime) { DeferredShutdowns::instance().start(std::move(runtime)); }

}  // namespace push::detail
