#include "core/clock.h"

#include <push/core/errors.h>

#include <thread>

namespace push::detail {

Clock::time_point Clock::now() {
  if (!manual()) return Steady::now();
  return time_point(std::chrono::nanoseconds(manual_ns_.load(std::memory_order_acquire)));
}

Clock::time_point Clock::deadline_after(std::chrono::nanoseconds timeout) {
  const time_point start = now();
  if (timeout <= std::chrono::nanoseconds::zero()) return start;
  const auto room = std::chrono::duration_cast<std::chrono::nanoseconds>(time_point::max() - start);
  return timeout >= room ? time_point::max() : start + std::chrono::duration_cast<duration>(timeout);
}

void Clock::sleep_until(time_point deadline) {
  if (!manual()) {
    std::this_thread::sleep_until(deadline);
    return;
  }
  while (now() < deadline) std::this_thread::sleep_for(kManualTick);
}

bool Clock::poll_until(time_point deadline, duration interval, const std::function<bool()>& done) {
  for (;;) {
    if (done()) return true;
    const time_point t = now();
    if (t >= deadline) return false;
    sleep_until(std::min(deadline, t + interval));
  }
}

ManualClock::ManualClock() {
  bool expected = false;
  Clock::manual_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              Clock::Steady::now().time_since_epoch()).count(),
                          std::memory_order_release);
  PUSH_CHECK(Clock::manual_.compare_exchange_strong(expected, true), "push::detail::ManualClock",
             "a ManualClock is installed already");
}

ManualClock::~ManualClock() { Clock::manual_.store(false, std::memory_order_release); }

void ManualClock::advance(std::chrono::nanoseconds by) {
  PUSH_CHECK(by.count() >= 0, "push::detail::ManualClock::advance", "time only moves forward, got ",
             by.count(), " ns");
  Clock::manual_ns_.fetch_add(by.count(), std::memory_order_acq_rel);
}

}  // namespace push::detail
