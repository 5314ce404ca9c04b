#include "core/clock.h"

#include <push/core/errors.h>

#include <thread>

namespace push::detail {

Clock::time_point Clock::now() {
  if (!manual()) return Steady::now();
  return time_point(std::chrono::nanoseconds(manual_ns_.load(std::memory_order_acquire)));
}

void Clock::sleep_until(time_point deadline) {
  if (!manual()) {
    std::this_thread::sleep_until(deadline);
    return;
  }
  const ManualWaiter counted;
  while (now() < deadline) std::this_thread::sleep_for(kManualTick);
}

bool Clock::poll_until(time_point deadline, duration interval, const std::function<bool()>& done) {
  if (manual()) {
    // The condition is checked every tick of real time (it may turn true without manual
    // time moving: another process, another thread); the deadline is manual time's.
    const ManualWaiter counted;
    for (;;) {
      if (done()) return true;
      if (now() >= deadline) return false;
      std::this_thread::sleep_for(kManualTick);
    }
  }
  for (;;) {
    if (done()) return true;
    const time_point t = now();
    if (t >= deadline) return false;
    sleep_until(std::min(deadline, t + interval));
  }
}

namespace {
std::atomic<bool> g_installed{false};  // claimed before manual time is set, released after it ends
}  // namespace

ManualClock::ManualClock() {
  bool expected = false;
  PUSH_CHECK(g_installed.compare_exchange_strong(expected, true), "push::detail::ManualClock",
             "a ManualClock is installed already");
  // The time first, then the switch: nobody reads manual time before it is set.
  Clock::manual_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::Steady::now().time_since_epoch()).count(),
      std::memory_order_release);
  Clock::manual_.store(true, std::memory_order_release);
}

ManualClock::~ManualClock() {
  Clock::manual_.store(false, std::memory_order_release);
  g_installed.store(false, std::memory_order_release);
}

void ManualClock::advance(std::chrono::nanoseconds by) {
  PUSH_CHECK(by.count() >= 0, "push::detail::ManualClock::advance", "time only moves forward, got ", by.count(), " ns");
  Clock::manual_ns_.fetch_add(by.count(), std::memory_order_acq_rel);
}

}  // namespace push::detail
