// The untyped thread pool: fiber event loops that pull tasks from one queue. A loop runs a
// "runner" fiber that takes tasks until the queue is empty; when a task waits (its runner
// suspends), the loop starts another runner if tasks are queued, so a waiting task never
// holds its thread. Which loops are busy is counted under one mutex with the queue, so a
// task queued just as every runner leaves is never stranded.
#include <push/parallel/thread_pool.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/event_loop.h"

namespace push::parallel::detail {

struct PoolCore::Impl {
  struct Task {
    Run run;
    Cancel cancel;
  };

  class Loop : public push::detail::EventLoop {
   public:
    Loop(Impl* pool, int index, const std::string& name)
        : EventLoop(Options{.name = name, .stopped = "the thread pool was terminated"}), pool_(pool), index_(index) {}
    ~Loop() override { stop(); }

   protected:
    void on_suspend(void*) override { pool_->suspended(index_); }
    void on_resume(void*) override { pool_->resumed(index_); }
    // A task waiting on its runner leaves the thread to the queued tasks (on_suspend):
    // it never looks for a value while they wait.
    bool has_other_work() const override {
      return EventLoop::has_other_work() || pool_->queued.load(std::memory_order_relaxed) > 0;
    }

   private:
    Impl* pool_;
    int index_;
  };

  const char* origin;

  std::mutex mutex;
  std::condition_variable drained;
  std::deque<Task> queue;
  std::atomic<std::size_t> queued{0};  // queue.size(), for Loop::has_other_work()
  std::vector<int> running;            // per loop: runners that run or may run now (not suspended)
  int64_t active = 0;                  // tasks started and not finished (waiting ones included)
  bool closed = false;
  bool stopped = false;
  // Last: the loops' hooks use the members above, so the loops stop before they go.
  std::vector<std::shared_ptr<Loop>> loops;

  ~Impl() {
    for (auto& loop : loops) loop->stop();
  }

  bool on_own_loop() const {
    auto* current = push::detail::EventLoop::current();
    return current != nullptr &&
           std::any_of(loops.begin(), loops.end(), [&](const auto& l) { return l.get() == current; });
  }

  // Under the mutex: makes loop `w` run a runner.
  void start_runner_locked(int w) {
    ++running[w];
    loops[w]->post_fiber([this, w] { run_tasks(w); }, [](std::exception_ptr) {});
  }

  void run_tasks(int w) {
    for (;;) {
      Task task;
      {
        std::lock_guard lock(mutex);
        if (queue.empty()) {
          --running[w];
          return;
        }
        task = std::move(queue.front());
        queue.pop_front();
        queued.store(queue.size(), std::memory_order_relaxed);
        ++active;
      }
      // The typed layer catches what the task throws; this is the last guard.
      try {
        task.run(w);
      } catch (...) {
      }
      std::lock_guard lock(mutex);
      if (--active == 0 && queue.empty()) drained.notify_all();
    }
  }

  void suspended(int w) {
    std::lock_guard lock(mutex);
    --running[w];
    if (!queue.empty() && running[w] == 0) start_runner_locked(w);
  }

  void resumed(int w) {
    std::lock_guard lock(mutex);
    ++running[w];
  }
};

PoolCore::PoolCore(int threads, const char* origin, const std::function<void(int worker)>& initializer)
    : impl_(std::make_shared<Impl>()) {
  const int n = threads > 0 ? threads : usable_cores();
  impl_->origin = origin;
  impl_->running.assign(n, 0);
  for (int w = 0; w < n; ++w) {
    impl_->loops.push_back(std::make_shared<Impl::Loop>(impl_.get(), w, "push-pool-" + std::to_string(w)));
    impl_->loops.back()->start();
  }
  if (!initializer) return;
  // Each worker's thread runs it before anything else is queued to it.
  std::vector<Future<int>> ran;
  for (int w = 0; w < n; ++w) {
    Promise<int> promise;
    ran.push_back(promise.future());
    impl_->loops[w]->post_fiber(
        [promise, &initializer, w] {
          initializer(w);
          promise.set_value(w);
        },
        [promise](std::exception_ptr e) { promise.set_error(std::move(e)); });
  }
  for (auto& f : ran) f.wait_ready();  // then none still runs the caller's initializer
  for (int w = 0; w < n; ++w) {
    if (auto error = ran[w].error()) {
      terminate();
      throw Error(c10::str("[", origin, "] the initializer failed on worker ", w, ": ", push::detail::describe(error)));
    }
  }
}

PoolCore::~PoolCore() { terminate(); }

int PoolCore::size() const { return static_cast<int>(impl_->loops.size()); }

void PoolCore::submit(Run run, Cancel cancel) {
  auto& s = *impl_;
  std::lock_guard lock(s.mutex);
  PUSH_CHECK(!s.closed, s.origin, "the pool is closed: it takes no more tasks");
  s.queue.push_back({std::move(run), std::move(cancel)});
  s.queued.store(s.queue.size(), std::memory_order_relaxed);
  // An idle loop starts a runner; a busy one takes the task when its runner gets to it.
  for (size_t w = 0; w < s.loops.size(); ++w) {
    if (s.running[w] == 0) {
      s.start_runner_locked(static_cast<int>(w));
      break;
    }
  }
}

void PoolCore::close() {
  std::lock_guard lock(impl_->mutex);
  impl_->closed = true;
}

size_t PoolCore::cancel_queued() {
  std::deque<Impl::Task> cancelled;
  {
    std::lock_guard lock(impl_->mutex);
    cancelled.swap(impl_->queue);
    impl_->queued.store(0, std::memory_order_relaxed);
    if (impl_->active == 0) impl_->drained.notify_all();
  }
  for (auto& task : cancelled) {
    task.cancel(std::make_exception_ptr(
        CancelledError(c10::str("[", impl_->origin, "] the task was cancelled before it started"))));
  }
  return cancelled.size();
}

void PoolCore::join() {
  auto& s = *impl_;
  {
    std::unique_lock lock(s.mutex);
    PUSH_CHECK(s.closed, s.origin, "join() needs close() or terminate() first");
    PUSH_CHECK(!s.on_own_loop(), s.origin, "join() from one of the pool's own tasks would wait for itself");
    s.drained.wait(lock, [&] { return s.queue.empty() && s.active == 0; });
    if (s.stopped) return;
    s.stopped = true;
  }
  for (auto& loop : s.loops) loop->stop();
}

void PoolCore::terminate() {
  PUSH_CHECK(!impl_->on_own_loop(), impl_->origin,
             "terminate() (or destruction) from one of the pool's own tasks would wait for itself");
  close();
  cancel_queued();
  // Tasks waiting on something that may never come are unwound by stopping the loops
  // (their waits throw CancelledError); running ones finish first.
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  for (auto& loop : impl_->loops) loop->stop();
}

}  // namespace push::parallel::detail
