#include "dist/rpc/round_trips.h"

#include <algorithm>

namespace push::dist::detail {

RoundTrips::RoundTrips(int peers, std::chrono::nanoseconds limit)
    : limit_ns_(std::max<int64_t>(0, limit.count())), average_ns_(static_cast<std::size_t>(std::max(peers, 0))) {
  for (auto& average : average_ns_) average.store(limit_ns_ / 2);
}

void RoundTrips::record(int peer, std::chrono::nanoseconds elapsed) {
  if (limit_ns_ == 0 || peer < 0 || static_cast<std::size_t>(peer) >= average_ns_.size()) return;
  auto& average = average_ns_[static_cast<std::size_t>(peer)];
  const int64_t sample = std::clamp<int64_t>(elapsed.count(), 0, 2 * limit_ns_);
  // Replies from one peer arrive on the I/O thread only: a plain load and store suffice.
  const int64_t old = average.load(std::memory_order_relaxed);
  average.store(old + (sample - old) / 8, std::memory_order_relaxed);
}

std::chrono::nanoseconds RoundTrips::window(int peer) const {
  if (limit_ns_ == 0 || peer < 0 || static_cast<std::size_t>(peer) >= average_ns_.size())
    return std::chrono::nanoseconds::zero();
  const int64_t average = average_ns_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
  if (average > limit_ns_) return std::chrono::nanoseconds::zero();
  return std::chrono::nanoseconds(std::min(limit_ns_, 2 * average));
}

}  // namespace push::dist::detail
