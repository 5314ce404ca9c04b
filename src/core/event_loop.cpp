#include "core/event_loop.h"

#include <push/core/errors.h>

#include <c10/util/Exception.h>

#include <pthread.h>

#include <utility>

#include "core/fiber.h"

namespace push::detail {

struct EventLoop::Task {
  Task(std::size_t stack_size, const c10::Device& device) : fiber(stack_size, device) {}
  Fiber fiber;
  std::function<void()> run;  // the job's, while its fiber lives
  Cancel cancel;
  void* owner = nullptr;
  bool suspended = false;
  bool cancelled = false;
  bool timed_out = false;  // resumed by its deadline, not by its future
  uint64_t ticket = 0;     // bumped per wait, so a stale resume is ignored
  std::size_t suspended_index = 0;
  std::optional<TimerQueue<Task*>::Handle> timer;
};

namespace {
thread_local EventLoop* t_loop = nullptr;
// Idle fibers beyond this many give their stack pages back to the system. Tasks are
// never freed while the loop lives: a stale resume job may still point at one.
constexpr std::size_t kWarmIdleTasks = 64;
}  // namespace

EventLoop::EventLoop(Options options) : options_(std::move(options)) {}

EventLoop::~EventLoop() { stop(); }

EventLoop* EventLoop::current() { return t_loop; }

void* EventLoop::running_owner() const { return current_ ? current_->owner : nullptr; }

void EventLoop::start() {
  // Without an owning shared_ptr a waiting fiber's resume would have no loop to post to.
  TORCH_INTERNAL_ASSERT(!weak_from_this().expired(), "an EventLoop must be owned by a shared_ptr");
  thread_ = std::thread([this] {
    t_loop = this;
    pthread_setname_np(pthread_self(), options_.name.substr(0, 15).c_str());
    thread_main();
    t_loop = nullptr;
  });
}

void EventLoop::post_inline(std::function<void()> run, Cancel cancel) {
  Job job;
  job.kind = Job::Kind::kInline;
  job.run = std::move(run);
  job.cancel = std::move(cancel);
  post(std::move(job));
}

void EventLoop::post_fiber(std::function<void()> run, Cancel cancel, void* owner) {
  Job job;
  job.kind = Job::Kind::kFiber;
  job.run = std::move(run);
  job.cancel = std::move(cancel);
  job.owner = owner;
  post(std::move(job));
}

void EventLoop::post(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      queue_.push_back(std::move(job));
      queued_.store(queue_.size(), std::memory_order_relaxed);
      cv_.notify_one();
      return;
    }
  }
  if (job.cancel) {
    job.cancel(
        std::make_exception_ptr(CancelledError(c10::str("[push] ", options_.stopped, "; the work was not started"))));
  }
}

bool EventLoop::has_other_work() const {
  if (queued_.load(std::memory_order_relaxed) > 0 || stop_asked_.load(std::memory_order_relaxed)) return true;
  const auto next = timers_.next();
  return next && *next <= Clock::now();
}

void EventLoop::stop() {
  stop_asked_.store(true, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void EventLoop::run() {
  for (;;) {
    std::optional<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      Clock::wait_until(cv_, lock, timers_.next(), [&] { return stop_requested_ || !queue_.empty(); });
      if (stop_requested_) {
        closed_ = true;
        break;
      }
      if (!queue_.empty()) {
        job.emplace(std::move(queue_.front()));
        queue_.pop_front();
        queued_.store(queue_.size(), std::memory_order_relaxed);
      }
    }
    fire_timers();
    if (job) run_guarded(*job);
  }

  // Shutdown: nothing new gets in (closed_). Fail what never started, then unwind the
  // fibers that are suspended: their wait() throws CancelledError.
  stopping_ = true;
  std::deque<Job> leftover;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    leftover.swap(queue_);
  }
  for (Job& job : leftover) {
    if (job.kind != Job::Kind::kResume && job.cancel) {
      job.cancel(
          std::make_exception_ptr(CancelledError(c10::str("[push] ", options_.stopped, " before the work started"))));
    }
  }
  cancel_suspended();
  timers_.clear();
  tasks_.clear();
  idle_tasks_.clear();
}

void EventLoop::cancel_suspended() {
  while (!suspended_.empty()) {
    Task* task = suspended_.back();
    task->cancelled = true;
    cancel_timer(task);
    remove_suspended(task);
    run_task_guarded(task);
  }
}

void EventLoop::fire_timers() {
  // Deadlines up to now only: a fiber that waits again with a tiny timeout gets a later
  // deadline, so it cannot keep the loop from its queue.
  const auto now = Clock::now();
  while (auto expired = timers_.pop_expired(now)) {
    Task* task = *expired;
    task->timer.reset();
    task->timed_out = true;
    remove_suspended(task);
    run_task_guarded(task);
  }
}

// The exception barrier for resumes the loop makes itself (timers, cancellation): a
// fiber job's own errors reach its future inside the fiber; what escapes is the loop's.
void EventLoop::run_task_guarded(Task* task) {
  try {
    run_task(task);
  } catch (...) {
    TORCH_WARN("[push::EventLoop] ", options_.name, ": resuming a fiber failed: ", describe(std::current_exception()));
  }
}

void EventLoop::cancel_timer(Task* task) {
  if (task->timer) {
    timers_.cancel(*task->timer);
    task->timer.reset();
  }
}

// The loop's exception barrier: whatever a job throws (a fiber stack that cannot be
// mapped, a bug) fails that job's future instead of terminating the process.
void EventLoop::run_guarded(Job& job) {
  try {
    dispatch(job);
  } catch (...) {
    report(job.kind != Job::Kind::kResume ? &job.cancel : nullptr, std::current_exception());
  }
}

// The same barrier inside a fiber: an exception must not unwind past the fiber's first
// frame (there is nothing above it to catch it), so it goes to the job's future here.
void EventLoop::run_fiber_body(Task& task) {
  try {
    task.run();
  } catch (...) {
    report(&task.cancel, std::current_exception());
  }
  // Whatever the job captured (its future, its arguments) is released now, not when this
  // idle fiber is next used.
  task.run = nullptr;
  task.cancel = nullptr;
}

void EventLoop::report(Cancel* cancel, const std::exception_ptr& error) {
  try {
    if (cancel != nullptr && *cancel) {
      (*cancel)(error);
      return;
    }
  } catch (...) {
    // Its future was already complete: nothing is waiting for this error.
  }
  TORCH_WARN("[push::EventLoop] ", options_.name, ": a job failed with no future to report to: ", describe(error));
}

void EventLoop::dispatch(Job& job) {
  switch (job.kind) {
    case Job::Kind::kInline:
      job.run();
      break;
    case Job::Kind::kFiber: {
      Task* task = nullptr;
      try {
        task = take_task();
      } catch (...) {
        throw Error(c10::str("[push::EventLoop] ", options_.name, ": cannot start ", describe_job(job.owner), ": ",
                             describe(std::current_exception())));
      }
      task->run = std::move(job.run);
      task->cancel = std::move(job.cancel);
      task->owner = job.owner;
      // Two pointers fit std::function's inline buffer: starting a fiber allocates nothing.
      task->fiber.start([this, task] { run_fiber_body(*task); });
      run_task(task);
      break;
    }
    case Job::Kind::kResume: {
      Task* task = job.task;
      if (!task->suspended || task->ticket != job.ticket) break;  // stale
      cancel_timer(task);
      remove_suspended(task);
      run_task(task);
      break;
    }
  }
}

void EventLoop::run_task(Task* task) {
  current_ = task;
  task->fiber.resume();
  current_ = nullptr;
  if (task->fiber.finished()) {
    recycle(task);
  } else {
    TORCH_INTERNAL_ASSERT(task->suspended, "a fiber returned without suspending");
    task->suspended_index = suspended_.size();
    suspended_.push_back(task);
  }
}

EventLoop::Task* EventLoop::take_task() {
  if (!idle_tasks_.empty()) {
    Task* task = idle_tasks_.back();
    idle_tasks_.pop_back();
    return task;
  }
  tasks_.push_back(std::make_unique<Task>(options_.stack_size, options_.device));
  return tasks_.back().get();
}

void EventLoop::recycle(Task* task) {
  task->owner = nullptr;
  task->cancelled = false;
  if (idle_tasks_.size() >= kWarmIdleTasks) task->fiber.release_stack();
  idle_tasks_.push_back(task);
}

void EventLoop::remove_suspended(Task* task) {
  task->suspended = false;
  Task* last = suspended_.back();
  suspended_[task->suspended_index] = last;
  last->suspended_index = task->suspended_index;
  suspended_.pop_back();
}

bool EventLoop::fiber_may_wait() {
  Task* task = current_;
  if (task == nullptr || Fiber::current() != &task->fiber || stopping_ || task->cancelled) return false;
  try {
    check_may_wait(task->owner);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool EventLoop::suspend_until(FutureCore& future, std::optional<Clock::time_point> deadline) {
  Task* task = current_;
  TORCH_INTERNAL_ASSERT(task && Fiber::current() == &task->fiber, "suspend_until outside a fiber job");
  const auto cancelled = [this] {
    return CancelledError(c10::str("[push] ", options_.stopped, " while a handler was waiting"));
  };
  if (stopping_ || task->cancelled) throw cancelled();
  check_may_wait(task->owner);
  if (future.ready()) return true;
  if (deadline && *deadline <= Clock::now()) return false;
  // With nothing else to run, the loop's thread would sleep: where the future expects to
  // complete soon (Promise::expect_within), look for that first, and stop looking as soon
  // as other work arrives.
  // (spin_until_ready asks has_other_work() before it looks, and only for a future with a window.)
  const auto limit = deadline ? std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - Clock::now())
                              : std::chrono::nanoseconds::max();
  if (future.spin_until_ready(limit, [this] { return has_other_work(); })) return true;
  // The ticket identifies this wait: a completion that arrives after the deadline resumed
  // the fiber posts a resume with an old ticket, which dispatch() ignores.
  const uint64_t ticket = ++task->ticket;
  std::weak_ptr<EventLoop> self = weak_from_this();
  future.add_callback([self, task, ticket] {
    if (auto loop = self.lock()) {
      Job job;
      job.kind = Job::Kind::kResume;
      job.task = task;
      job.ticket = ticket;
      loop->post(std::move(job));
    }
  });
  if (deadline) task->timer = timers_.add(*deadline, task);
  task->timed_out = false;
  on_suspend(task->owner);
  task->suspended = true;
  task->fiber.suspend();
  // Resumed by dispatch() (the future is ready), fire_timers() or cancel_suspended().
  if (task->cancelled) throw cancelled();
  on_resume(task->owner);
  return !std::exchange(task->timed_out, false) || future.ready();
}

}  // namespace push::detail
