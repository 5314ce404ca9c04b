#include <push/core/future.h>

#include <push/core/cores.h>

#include "core/torch_compat.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <thread>

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

namespace {
int64_t steady_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
// Windows and limits are cut to this, so that a deadline computed from one never overflows.
constexpr int64_t kLongestSpinNs = int64_t{3600} * 1000 * 1000 * 1000;

/// A seat among the threads looking for a value: one fewer than the cores this thread may
/// run on (none on one core), so that lookers never take every core from the threads that
/// would complete their values. The mask is read at every look (one system call, well below
/// the window): `taskset` on a running process changes it.
class SpinSeat {
 public:
  SpinSeat() {
    const int seats = usable_cores() - 1;
    taken_ = spinners().fetch_add(1, std::memory_order_relaxed) < seats;
    if (!taken_) spinners().fetch_sub(1, std::memory_order_relaxed);
  }
  ~SpinSeat() {
    if (taken_) spinners().fetch_sub(1, std::memory_order_relaxed);
  }
  SpinSeat(const SpinSeat&) = delete;
  SpinSeat& operator=(const SpinSeat&) = delete;
  bool taken() const { return taken_; }

 private:
  static std::atomic<int>& spinners() {
    static std::atomic<int> count{0};
    return count;
  }
  bool taken_ = false;
};
}  // namespace

void FutureCore::expect_within(std::chrono::nanoseconds window) {
  const int64_t w = std::clamp<int64_t>(window.count(), 0, kLongestSpinNs);
  spin_until_ns_.store(w == 0 ? 0 : steady_ns() + w, std::memory_order_relaxed);
}

bool FutureCore::spin_until_ready(std::chrono::nanoseconds limit, const std::function<bool()>& stop) const {
  // No window (most futures): no clock read, no seat.
  const int64_t end = spin_until_ns_.load(std::memory_order_relaxed);
  if (end == 0) return ready();
  // Steady time, not push's Clock: the window is real CPU time, whatever a ManualClock says.
  const int64_t now = steady_ns();
  const int64_t until = std::min(end, now + std::clamp<int64_t>(limit.count(), 0, kLongestSpinNs));
  if (until <= now || (stop && stop())) return ready();
  SpinSeat seat;
  if (!seat.taken()) return ready();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (steady_ns() >= until || (stop && stop())) return ready();
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
