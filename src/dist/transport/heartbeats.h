#pragma once
// When each peer was last heard from, and when this member's next heartbeats are due: a
// peer that sends nothing for the heartbeat timeout is silent (stopped, hung or cut off),
// and every quarter of it this member sends each peer a heartbeat. Off with a timeout of 0,
// and until start(): a member still waiting for a late one to join must not take it for
// silent.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "core/clock.h"

namespace push::dist::detail {

class Heartbeats {
 public:
  Heartbeats(int members, std::chrono::milliseconds timeout);

  /// Something came from `peer` (any thread).
  void heard_from(int peer);
  /// Whether nothing came from `peer` for longer than the timeout (never when off).
  bool silent(int peer) const;
  /// Turns them on, every peer heard from now.
  void start();
  /// The I/O thread: whether a round of heartbeats is due now (then the next is planned),
  /// and when the next one is (nullopt: off).
  std::optional<push::detail::Clock::time_point> round(bool& due);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  const int members_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<std::atomic<int64_t>[]> last_heard_;  // ns on push's Clock, by group rank
  std::atomic<bool> on_{false};
  push::detail::Clock::time_point next_{};  // the I/O thread's
};

}  // namespace push::dist::detail
