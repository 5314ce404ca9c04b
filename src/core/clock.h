#pragma once
// The one clock every deadline, timer and polling wait in push reads, and the one way to
// wait on it. Normally it is std::chrono::steady_clock. A test installs a ManualClock to
// make time a value it moves itself: deadlines then pass when the test advances the
// clock, not when the wall clock does, so a timeout test neither sleeps nor races.
//
//   detail::ManualClock clock;                 // from here on, Clock::now() is manual
//   auto f = loop_or_handler_waits_for(50ms);  // its deadline: Clock::now() + 50ms
//   clock.advance(50ms);                       // the deadline passes now, for everyone
//
// With a ManualClock installed, the waits below poll every kManualTick of real time for
// their condition or the manual deadline (the clock cannot wake a condition variable it
// does not know of), so code under test keeps its real structure: the same threads, the
// same condition variables. Only one ManualClock exists at a time (per process).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>

namespace push::detail {

class Clock {
 public:
  using Steady = std::chrono::steady_clock;
  using time_point = Steady::time_point;
  using duration = Steady::duration;

  /// The current time: steady_clock's, or the installed ManualClock's.
  static time_point now();
  /// Whether a ManualClock is installed.
  static bool manual() { return manual_.load(std::memory_order_acquire); }
  /// `now() + timeout`, saturated (a timeout of years, or duration::max(), never wraps).
  static time_point deadline_after(std::chrono::nanoseconds timeout);

  /// Waits on `cv` (its mutex held by `lock`) until `ready()` or `deadline`; true when
  /// ready. Without a deadline it waits for `ready()` alone.
  template <class Ready>
  static bool wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         std::optional<time_point> deadline, Ready ready);
  /// Sleeps the calling thread until `deadline`.
  static void sleep_until(time_point deadline);
  static void sleep_for(duration d) { sleep_until(deadline_after(d)); }
  /// Calls `done()` every `interval` until it returns true (then true) or `deadline`
  /// passes (then false): for conditions nobody can notify (a key in a remote store, a
  /// child process, a port).
  static bool poll_until(time_point deadline, duration interval, const std::function<bool()>& done);

  /// How often a wait re-checks a manual deadline, in real time.
  static constexpr std::chrono::milliseconds kManualTick{1};

 private:
  friend class ManualClock;
  static inline std::atomic<bool> manual_{false};
  static inline std::atomic<int64_t> manual_ns_{0};  // since the epoch of steady_clock
};

/// Installs manual time for its lifetime: it starts at the real now() and moves only by
/// advance(). Construct it before the code under test starts its threads.
class ManualClock {
 public:
  ManualClock();
  ~ManualClock();
  ManualClock(const ManualClock&) = delete;
  ManualClock& operator=(const ManualClock&) = delete;

  /// Moves time forward; every deadline up to the new now() has passed.
  void advance(std::chrono::nanoseconds by);
};

template <class Ready>
bool Clock::wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                       std::optional<time_point> deadline, Ready ready) {
  if (!deadline) {
    cv.wait(lock, ready);
    return true;
  }
  if (!manual()) return cv.wait_until(lock, *deadline, ready);
  while (!ready()) {
    if (now() >= *deadline) return false;
    cv.wait_for(lock, kManualTick);
  }
  return true;
}

}  // namespace push::detail
