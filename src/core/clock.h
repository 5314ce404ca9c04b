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
// With a ManualClock installed, wait_until and poll_until check their condition every
// kManualTick of real time and their deadline against manual time (the clock cannot wake a
// condition variable it does not know of), so code under test keeps its real structure:
// the same threads, the same condition variables; sleep_until sleeps until manual time
// reaches its deadline. Only one ManualClock exists at a time (per process).
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
  /// `now() + timeout`, saturated: a timeout of years, or any duration's max() ("until it
  /// happens"), never wraps. Compared in the caller's own unit, so that converting it to
  /// the clock's nanoseconds cannot overflow first.
  template <class Rep, class Period>
  static time_point deadline_after(std::chrono::duration<Rep, Period> timeout);

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
  /// Counts a thread waiting on a manual deadline while it lives.
  struct ManualWaiter {
    ManualWaiter() { manual_waiters_.fetch_add(1, std::memory_order_acq_rel); }
    ~ManualWaiter() { manual_waiters_.fetch_sub(1, std::memory_order_acq_rel); }
  };
  static inline std::atomic<bool> manual_{false};
  static inline std::atomic<int64_t> manual_ns_{0};  // since the epoch of steady_clock
  static inline std::atomic<int> manual_waiters_{0};
};

/// Installs manual time for its lifetime: it starts at the real now() and moves only by
/// advance(). Construct it before the code under test starts its threads and destroy it
/// after they stop: once it is gone, now() is the real clock's again, which may be behind
/// the manual time a deadline was set on (that deadline then comes later, never earlier).
class ManualClock {
 public:
  ManualClock();
  ~ManualClock();
  ManualClock(const ManualClock&) = delete;
  ManualClock& operator=(const ManualClock&) = delete;

  /// Moves time forward; every deadline up to the new now() has passed.
  void advance(std::chrono::nanoseconds by);
  /// Threads waiting right now for a deadline on this clock (a sleep, a timed wait, an
  /// event loop's nearest timer): a test advances once the waits it means to time out are
  /// in place, so that their deadlines are where it expects them.
  int waiters() const { return Clock::manual_waiters_.load(std::memory_order_acquire); }
};

template <class Rep, class Period>
Clock::time_point Clock::deadline_after(std::chrono::duration<Rep, Period> timeout) {
  using Timeout = std::chrono::duration<Rep, Period>;
  const time_point start = now();
  if (timeout <= Timeout::zero()) return start;
  // Converting the room (nanoseconds) to a coarser unit only shrinks its count.
  const auto room = std::chrono::duration_cast<Timeout>(time_point::max() - start);
  return timeout >= room ? time_point::max() : start + std::chrono::duration_cast<duration>(timeout);
}

template <class Ready>
bool Clock::wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                       std::optional<time_point> deadline, Ready ready) {
  if (!deadline) {
    cv.wait(lock, ready);
    return true;
  }
  if (!manual()) return cv.wait_until(lock, *deadline, ready);
  const ManualWaiter counted;
  while (!ready()) {
    if (now() >= *deadline) return false;
    cv.wait_for(lock, kManualTick);
  }
  return true;
}

}  // namespace push::detail
