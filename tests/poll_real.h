#pragma once
// Waiting on what push's Clock does not drive: other processes, the kernel, a network
// namespace. The one real-time polling loop of the tests; waits on push's own deadlines
// use push::testing::eventually (test_util.h), which a ManualClock moves.
#include <chrono>
#include <functional>
#include <thread>

namespace push::testing {

/// Asks `done` every `interval` of real time until it holds (true) or `limit` has passed
/// (false, after a last look).
inline bool poll_real(const std::function<bool()>& done, std::chrono::steady_clock::duration limit,
                      std::chrono::milliseconds interval = std::chrono::milliseconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return done();
    std::this_thread::sleep_for(interval);  // real time is the point: see the file comment
  }
  return true;
}

}  // namespace push::testing
