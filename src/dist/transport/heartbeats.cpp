#include "dist/transport/heartbeats.h"

#include <algorithm>

namespace push::dist::detail {

using push::detail::Clock;

Heartbeats::Heartbeats(int members, std::chrono::milliseconds timeout)
    : members_(members),
      timeout_(timeout),
      last_heard_(std::make_unique<std::atomic<int64_t>[]>(static_cast<std::size_t>(std::max(members, 1)))) {
  for (int i = 0; i < members_; ++i) heard_from(i);
}

void Heartbeats::heard_from(int peer) {
  last_heard_[static_cast<std::size_t>(peer)].store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

bool Heartbeats::silent(int peer) const {
  if (timeout_.count() <= 0 || peer < 0 || peer >= members_) return false;
  const Clock::time_point heard(
      Clock::duration(last_heard_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed)));
  return Clock::now() - heard > std::chrono::duration_cast<Clock::duration>(timeout_);
}

void Heartbeats::start() {
  for (int i = 0; i < members_; ++i) heard_from(i);
  on_ = true;
}

std::optional<Clock::time_point> Heartbeats::round(bool& due) {
  due = false;
  if (timeout_.count() <= 0 || !on_) return std::nullopt;
  const auto now = Clock::now();
  if (now < next_) return next_;
  next_ = now + timeout_ / 4;
  due = true;
  return next_;
}

}  // namespace push::dist::detail
