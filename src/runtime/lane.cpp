#include "runtime/lane.h"

#include <push/core/errors.h>

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <string>
#include <utility>

#include "runtime/particle_record.h"

namespace push::detail {

struct Lane::Task {
  Task(std::size_t stack_size, const torch::Device& device) : fiber(stack_size, device) {}
  Fiber fiber;
  ParticleRecord* owner = nullptr;
  bool owner_pinned = false;
  bool suspended = false;
  bool cancelled = false;
  bool timed_out = false;  // resumed by its deadline, not by its future
  uint64_t ticket = 0;  // bumped per wait, so a stale resume is ignored
  std::size_t suspended_index = 0;
  std::optional<std::multimap<Clock::time_point, Task*>::iterator> timer;
};

namespace {
thread_local Lane* t_lane = nullptr;
// Idle fibers beyond this many give their stack pages back to the system. Tasks are
// never freed while the lane lives: a stale resume job may still point at one.
constexpr std::size_t kWarmIdleTasks = 64;

// OpenBLAS (Debian's LibTorch links whichever BLAS the system selects) keeps one pthread
// pool per process, not per calling thread, so at::set_num_threads does not limit it.
// Looked up at run time: with another BLAS the symbols are absent and nothing is done.
// push only limits the pool: never above the size it had before push first touched it
// (OPENBLAS_NUM_THREADS, or the cores), which the user may have lowered on purpose.
void set_blas_threads(int n) {
  using Get = int (*)();
  using Set = void (*)(int);
  static const auto get = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  static const auto set = reinterpret_cast<Set>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr) return;
  static const int initial = get();
  n = std::max(1, std::min(n, initial));
  if (get() != n) set(n);
}

const char* const kCancelledWhileWaiting =
    "[push] the distribution was destroyed while a handler was waiting";
}  // namespace

Lane::Lane(LaneConfig config)
    : config_(std::move(config)),
      cache_(config_.device, config_.cache_size),
      views_(config_.view_size) {}

Lane::~Lane() { stop(); }

Lane* Lane::current() { return t_lane; }

ParticleRecord* Lane::running() const { return current_ ? current_->owner : nullptr; }

void Lane::start() {
  thread_ = std::thread([this] {
    t_lane = this;
    std::string name = "push-lane-" + std::to_string(config_.index);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    c10::DeviceGuard device_guard(config_.device);
    // BLAS first: an OpenMP build of OpenBLAS sets this thread's OpenMP count, which
    // at::set_num_threads then sets to the lane's.
    set_blas_threads(config_.blas_threads);
    at::set_num_threads(config_.intra_op_threads);
    loop();
    t_lane = nullptr;
  });
}

void Lane::post(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      queue_.push_back(std::move(job));
      cv_.notify_one();
      return;
    }
  }
  if (job.cancel) {
    job.cancel(std::make_exception_ptr(CancelledError(
        "[push] the distribution is shutting down; the work was not started")));
  }
}

void Lane::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void Lane::loop() {
  for (;;) {
    std::optional<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto woken = [&] { return stop_requested_ || !queue_.empty(); };
      if (timers_.empty()) {
        cv_.wait(lock, woken);
      } else {
        cv_.wait_until(lock, timers_.begin()->first, woken);
      }
      if (stop_requested_) {
        closed_ = true;
        break;
      }
      if (!queue_.empty()) {
        job.emplace(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    fire_timers();
    if (job) run_guarded(*job);
  }

  // Shutdown: nothing new gets in (closed_). Fail what never started, then unwind the
  // handlers that are suspended: their wait() throws CancelledError.
  stopping_ = true;
  std::deque<Job> leftover;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    leftover.swap(queue_);
  }
  for (Job& job : leftover) {
    if (job.kind != Job::Kind::kResume && job.cancel) {
      job.cancel(std::make_exception_ptr(CancelledError(
          "[push] the distribution was destroyed before the work started")));
    }
  }
  cancel_suspended();
  timers_.clear();
  tasks_.clear();
  idle_tasks_.clear();
}

void Lane::cancel_suspended() {
  while (!suspended_.empty()) {
    Task* task = suspended_.back();
    task->cancelled = true;
    cancel_timer(task);
    remove_suspended(task);
    run_task_guarded(task);
  }
}

void Lane::fire_timers() {
  // Deadlines up to now only: a handler that waits again with a tiny timeout gets a later
  // deadline, so it cannot keep the loop from its queue.
  const auto now = Clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    Task* task = timers_.begin()->second;
    timers_.erase(timers_.begin());
    task->timer.reset();
    task->timed_out = true;
    remove_suspended(task);
    run_task_guarded(task);
  }
}

// The exception barrier for resumes the loop makes itself (timers, cancellation): the
// handler's own errors reach its future inside the fiber; what escapes is the runtime's.
void Lane::run_task_guarded(Task* task) {
  try {
    run_task(task);
  } catch (...) {
    TORCH_WARN("[push::Lane] lane ", config_.index, ": resuming a handler failed: ",
               describe(std::current_exception()));
  }
}

void Lane::cancel_timer(Task* task) {
  if (task->timer) {
    timers_.erase(*task->timer);
    task->timer.reset();
  }
}

// The loop's exception barrier: whatever a job throws (a fiber stack that cannot be
// mapped, a bug) fails that job's future instead of terminating the process.
void Lane::run_guarded(Job& job) {
  try {
    dispatch(job);
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    try {
      if (job.kind != Job::Kind::kResume && job.cancel) {
        job.cancel(error);
        return;
      }
    } catch (...) {
      // Its future was already complete: nothing is waiting for this error.
    }
    TORCH_WARN("[push::Lane] lane ", config_.index, ": a job failed with no future to report to: ",
               describe(error));
  }
}

void Lane::dispatch(Job& job) {
  switch (job.kind) {
    case Job::Kind::kInline:
      job.run();
      break;
    case Job::Kind::kHandler: {
      Task* task = nullptr;
      try {
        task = take_task();
      } catch (...) {
        throw Error(c10::str("[push::Lane] cannot start a handler of particle ",
                             job.owner != nullptr ? job.owner->pid : -1, " on lane ",
                             config_.index, ": ", describe(std::current_exception())));
      }
      task->owner = job.owner;
      task->fiber.start(std::move(job.run));
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

void Lane::run_task(Task* task) {
  current_ = task;
  task->fiber.resume();
  current_ = nullptr;
  if (task->fiber.finished()) {
    recycle(task);
  } else {
    TORCH_INTERNAL_ASSERT(task->suspended, "a handler fiber returned without suspending");
    task->suspended_index = suspended_.size();
    suspended_.push_back(task);
  }
}

Lane::Task* Lane::take_task() {
  if (!idle_tasks_.empty()) {
    Task* task = idle_tasks_.back();
    idle_tasks_.pop_back();
    return task;
  }
  tasks_.push_back(std::make_unique<Task>(config_.stack_size, config_.device));
  return tasks_.back().get();
}

void Lane::recycle(Task* task) {
  task->owner = nullptr;
  task->owner_pinned = false;
  task->cancelled = false;
  if (idle_tasks_.size() >= kWarmIdleTasks) task->fiber.release_stack();
  idle_tasks_.push_back(task);
}

void Lane::remove_suspended(Task* task) {
  task->suspended = false;
  Task* last = suspended_.back();
  suspended_[task->suspended_index] = last;
  last->suspended_index = task->suspended_index;
  suspended_.pop_back();
}

void Lane::pin_running() {
  Task* task = current_;
  if (!task || !task->owner || task->owner_pinned) return;
  cache_.pin(*task->owner);
  task->owner_pinned = true;
  task->owner->version.fetch_add(1, std::memory_order_acq_rel);
}

void Lane::unpin_running() {
  Task* task = current_;
  if (!task || !task->owner || !task->owner_pinned) return;
  task->owner_pinned = false;
  cache_.unpin(*task->owner);
}

bool Lane::suspend_until(FutureCore& future, std::optional<Clock::time_point> deadline) {
  Task* task = current_;
  TORCH_INTERNAL_ASSERT(task && Fiber::current() == &task->fiber,
                        "suspend_until outside a handler fiber");
  if (stopping_ || task->cancelled) throw CancelledError(kCancelledWhileWaiting);
  if (future.ready()) return true;
  if (deadline && *deadline <= Clock::now()) return false;
  // The ticket identifies this wait: a completion that arrives after the deadline resumed
  // the handler posts a resume with an old ticket, which dispatch() ignores.
  const uint64_t ticket = ++task->ticket;
  std::weak_ptr<Lane> self = weak_from_this();
  future.add_callback([self, task, ticket] {
    if (auto lane = self.lock()) {
      Job job;
      job.kind = Job::Kind::kResume;
      job.task = task;
      job.ticket = ticket;
      lane->post(std::move(job));
    }
  });
  if (deadline) task->timer = timers_.emplace(*deadline, task);
  task->timed_out = false;
  unpin_running();
  task->suspended = true;
  task->fiber.suspend();
  // Resumed by dispatch() (the future is ready), fire_timers() or cancel_suspended().
  if (task->cancelled) throw CancelledError(kCancelledWhileWaiting);
  pin_running();
  return !std::exchange(task->timed_out, false) || future.ready();
}

}  // namespace push::detail
