#include "runtime/lane.h"

#include <push/runtime/errors.h>

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <pthread.h>

#include <algorithm>
#include <string>

#include "runtime/particle_record.h"

namespace push::detail {

struct Lane::Task {
  explicit Task(std::size_t stack_size) : fiber(stack_size) {}
  Fiber fiber;
  ParticleRecord* owner = nullptr;
  bool owner_pinned = false;
  bool suspended = false;
  bool cancelled = false;
  uint64_t ticket = 0;  // bumped per wait, so a stale resume is ignored
  std::size_t suspended_index = 0;
};

namespace {
thread_local Lane* t_lane = nullptr;
// Idle fibers beyond this many give their stack pages back to the system. Tasks are
// never freed while the lane lives: a stale resume job may still point at one.
constexpr std::size_t kWarmIdleTasks = 64;
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
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_requested_ || !queue_.empty(); });
      if (stop_requested_) {
        closed_ = true;
        break;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    dispatch(job);
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
  tasks_.clear();
  idle_tasks_.clear();
}

void Lane::cancel_suspended() {
  while (!suspended_.empty()) {
    Task* task = suspended_.back();
    task->cancelled = true;
    remove_suspended(task);
    run_task(task);
  }
}

void Lane::dispatch(Job& job) {
  switch (job.kind) {
    case Job::Kind::kInline:
      job.run();
      break;
    case Job::Kind::kHandler: {
      Task* task = take_task();
      task->owner = job.owner;
      task->fiber.start(std::move(job.run));
      run_task(task);
      break;
    }
    case Job::Kind::kResume: {
      Task* task = job.task;
      if (!task->suspended || task->ticket != job.ticket) break;  // stale
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
  tasks_.push_back(std::make_unique<Task>(config_.stack_size));
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

void Lane::suspend_until(FutureCore& future) {
  Task* task = current_;
  TORCH_INTERNAL_ASSERT(task && Fiber::current() == &task->fiber,
                        "suspend_until outside a handler fiber");
  if (stopping_ || task->cancelled) {
    throw CancelledError("[push] the distribution was destroyed while a handler was waiting");
  }
  if (future.ready()) return;
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
  unpin_running();
  task->suspended = true;
  task->fiber.suspend();
  // Resumed by dispatch() (the future is ready) or by cancel_suspended().
  if (task->cancelled) {
    throw CancelledError("[push] the distribution was destroyed while a handler was waiting");
  }
  pin_running();
}

}  // namespace push::detail
