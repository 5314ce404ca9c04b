#pragma once
// How long a member waiting for a reply looks for it before it sleeps. Waking a sleeping
// thread costs about as much as a small call's round trip over loopback, so a waiter that
// checks for the reply for a little longer than the round trip usually takes gets it
// sooner, at the cost of that much CPU (Promise::expect_within). The window is twice the
// recent round trip to the member the call went to, measured from each request's send to
// its reply's arrival; calls that take longer than the limit (a handler that trains, a
// slow link) get none, so their waiters sleep at once and burn nothing.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace push::dist::detail {

/// Thread-safe: senders ask for windows, the I/O thread records round trips.
class RoundTrips {
 public:
  /// For `peers` members; no window is longer than `limit` (0: none at all).
  RoundTrips(int peers, std::chrono::nanoseconds limit);

  /// A reply from `peer` arrived `elapsed` after its request was sent.
  void record(int peer, std::chrono::nanoseconds elapsed);
  /// How long a waiter for a reply from `peer` checks for it before it sleeps.
  std::chrono::nanoseconds window(int peer) const;

 private:
  const int64_t limit_ns_;
  // Per peer: a moving average of the round trip (each new one weighs 1/8), each clipped to
  // twice the limit so that one slow call does not turn the windows off for long. Starts at
  // half the limit: the first calls look for their replies for the whole limit.
  std::vector<std::atomic<int64_t>> average_ns_;
};

}  // namespace push::dist::detail
