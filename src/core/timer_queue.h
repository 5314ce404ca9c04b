#pragma once
// Deadlines kept in order, on the one Clock (core/clock.h): an event loop's suspended
// fibers waiting with a timeout, and the RPC calls waiting for replies, both keep theirs
// here. Not thread-safe: its owner guards it (a loop's thread, or the owner's mutex).
//
//   TimerQueue<Task*> timers;
//   auto handle = timers.add(Clock::deadline_after(50ms), task);
//   timers.cancel(handle);                  // completed before its deadline
//   cv.wait_until(..., timers.next(), ...)  // sleep at most until the nearest one
//   while (auto t = timers.pop_expired(Clock::now())) resume_timed_out(*t);
#include <map>
#include <optional>
#include <vector>

#include "core/clock.h"

namespace push::detail {

template <class T>
class TimerQueue {
  using Map = std::multimap<Clock::time_point, T>;

 public:
  /// Identifies one deadline, for cancel(); valid until that deadline fires or is cancelled.
  using Handle = typename Map::iterator;

  Handle add(Clock::time_point deadline, T value) { return timers_.emplace(deadline, std::move(value)); }
  void cancel(Handle handle) { timers_.erase(handle); }
  /// The nearest deadline, if any.
  std::optional<Clock::time_point> next() const {
    if (timers_.empty()) return std::nullopt;
    return timers_.begin()->first;
  }
  /// Removes and returns the nearest deadline's value when it is at or before `now`.
  std::optional<T> pop_expired(Clock::time_point now) {
    if (timers_.empty() || timers_.begin()->first > now) return std::nullopt;
    std::optional<T> out(std::move(timers_.begin()->second));
    timers_.erase(timers_.begin());
    return out;
  }
  /// Removes and returns, nearest first, everything whose deadline is at or before `now`.
  std::vector<T> take_expired(Clock::time_point now) {
    std::vector<T> out;
    while (auto value = pop_expired(now)) out.push_back(std::move(*value));
    return out;
  }
  bool empty() const { return timers_.empty(); }
  void clear() { timers_.clear(); }

 private:
  Map timers_;
};

}  // namespace push::detail
