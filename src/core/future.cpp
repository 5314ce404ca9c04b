#include <push/core/future.h>

#include "core/torch_compat.h"

#include <c10/util/Exception.h>

#include "core/clock.h"
#include "core/event_loop.h"
#include "core/fiber.h"

namespace push {
namespace detail {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

namespace {
/// One step of a busy wait: tells the CPU (and a hyperthread sibling) that this core spins.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// A wait on an event loop's own thread outside a fiber would block the loop that must make
// progress for the future to complete.
void check_not_loop_stack(const char* origin) {
  if (EventLoop::current() != nullptr && Fiber::current() == nullptr) {
    throw Error(c10::str("[", origin,
                         "] cannot block an event loop (a device lane) outside a fiber job; "
                         "wait inside a handler or from another thread"));
  }
}

// The loop running this fiber job, when this wait may suspend it; throws where it may not.
// Any event loop, not only a device lane: RPC handlers run as fibers too.
EventLoop* suspendable_loop(const char* origin) {
  EventLoop* loop = EventLoop::current();
  if (loop == nullptr || Fiber::current() == nullptr) return nullptr;
  // The autograd engine keeps per-thread state for the backward pass it is running on this
  // thread (its graph task, ready queue, depth); a second fiber's backward on the same
  // thread would run inside it. That state cannot be saved, so a fiber never leaves it.
  if (compat::in_backward_pass()) {
    throw Error(c10::str("[", origin,
                         "] cannot wait inside a backward pass (a tensor or module hook run by "
                         "the autograd engine) on a future that is not complete: finish "
                         "backward(), then wait"));
  }
  return loop;
}
}  // namespace

bool waits_suspend_here() {
  EventLoop* loop = EventLoop::current();
  return loop != nullptr && Fiber::current() != nullptr && !compat::in_backward_pass() && loop->fiber_may_wait();
}

bool FutureCore::spin_until_ready(std::chrono::nanoseconds limit, const std::function<bool()>& stop) const {
  const auto window = std::min(limit, std::chrono::nanoseconds(spin_ns_.load(std::memory_order_relaxed)));
  if (window <= std::chrono::nanoseconds::zero()) return ready();
  // Steady time, not push's Clock: the window is real CPU time, whatever a ManualClock says.
  const auto until = std::chrono::steady_clock::now() + window;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until || (stop && stop())) return ready();
  }
}

void FutureCore::wait_ready() {
  if (ready()) return;
  if (EventLoop* loop = suspendable_loop("push::Future::wait")) {
    loop->suspend_until(*this, std::nullopt);
    return;
  }
  check_not_loop_stack("push::Future::wait");
  if (spin_until_ready(std::chrono::nanoseconds::max())) return;
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return ready(); });
}

bool FutureCore::wait_ready_for(std::chrono::nanoseconds timeout) {
  if (ready()) return true;
  if (timeout <= std::chrono::nanoseconds::zero()) return false;
  const auto deadline = Clock::deadline_after(timeout);
  if (EventLoop* loop = suspendable_loop("push::Future::wait_for")) {
    return loop->suspend_until(*this, deadline);
  }
  check_not_loop_stack("push::Future::wait_for");
  if (spin_until_ready(timeout)) return true;
  std::unique_lock<std::mutex> lock(mutex_);
  return Clock::wait_until(cv_, lock, deadline, [&] { return ready(); });
}

void FutureCore::add_callback(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ready()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void FutureCore::mark_ready(std::exception_ptr error, c10::function_ref<void()> store) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Checked before anything is written: a second completion must not touch the first.
    if (ready()) throw Error("[push::Promise] this future already has a value or an error");
    store();
    error_ = std::move(error);
    ready_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  // Every continuation runs: one that throws must not leave the waiters behind it hanging.
  // Its exception has nowhere to go (the completer's work succeeded), so it is reported.
  for (auto& callback : callbacks) {
    try {
      callback();
    } catch (...) {
      TORCH_WARN("[push::Future] a continuation threw (the others still ran): ", describe(std::current_exception()));
    }
  }
}

}  // namespace detail
}  // namespace push
