#include "dist/rendezvous/store_barrier.h"

#include "core/clock.h"
#include "dist/c10d.h"
#include "dist/rendezvous/store_deadline.h"

#include <push/core/errors.h>

#include <vector>

namespace push::dist::detail {

using push::detail::Clock;

namespace {

/// How long past a barrier's timeout its store calls are cut off: a store that answers
/// reports the timeout itself first.
std::chrono::milliseconds slack(std::chrono::milliseconds timeout) {
  return std::chrono::milliseconds(500) + timeout / 10;
}

std::string stopped_store() {
  return "the store (hosted by rank 0) stopped answering: is rank 0 stopped or its host unreachable?";
}

}  // namespace

void StoreBarrier::arrive_and_wait_for_live(int rank, std::chrono::milliseconds timeout, const char* origin,
                                            const std::function<std::set<int>()>& lost,
                                            const std::function<bool()>& store_lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t generation = generation_++;
  const std::string base = c10::str(prefix_, "live/", generation, "/");
  auto host_lost = [&] { return store_lost && store_lost(); };
  StoreDeadline bound(host_, port_, Clock::deadline_after(timeout + slack(timeout)), store_lost);
  try {
    waiter_->set(base + std::to_string(rank), std::vector<uint8_t>{1});
    std::vector<std::string> missing;
    const bool all = Clock::poll_until(Clock::deadline_after(timeout), std::chrono::milliseconds(20), [&] {
      const std::set<int> gone = lost();
      missing.clear();
      for (int r = 0; r < size_; ++r) {
        if (!gone.count(r) && !waiter_->check({base + std::to_string(r)})) missing.push_back(std::to_string(r));
      }
      return missing.empty();
    });
    if (!all) throw Error(c10::str("ranks ", c10::Join(", ", missing), " of the group did not arrive"));
  } catch (const std::exception&) {
    if (host_lost()) {
      throw Error(c10::str("[", origin, "] barrier ", generation, " of ", size_,
                           " ranks: rank 0, which hosts the job's store, is stopped or cut off (nothing heard from "
                           "it within the heartbeat timeout)"));
    }
    throw Error(c10::str("[", origin, "] barrier ", generation, " of ", size_, " ranks did not complete within ",
                         timeout.count(),
                         " ms (a rank left or is stuck): ", bound.fired() ? stopped_store() : current_message()));
  }
}

void StoreBarrier::arrive_and_wait(std::chrono::milliseconds timeout, const char* origin) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t generation = generation_++;
  const std::string base = c10::str(prefix_, generation);
  StoreDeadline bound(host_, port_, Clock::deadline_after(timeout + slack(timeout)));
  try {
    if (waiter_->add(base + "/arrived", 1) == size_) {
      // Last to arrive: release this generation, and drop the previous one's keys, which
      // every rank has left (they all arrived here after it).
      waiter_->set(base + "/open", std::vector<uint8_t>{1});
      if (generation > 0) {
        const std::string previous = c10::str(prefix_, generation - 1);
        waiter_->deleteKey(previous + "/arrived");
        waiter_->deleteKey(previous + "/open");
      }
    } else {
      waiter_->wait({base + "/open"}, timeout);
    }
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] barrier ", generation, " of ", size_, " ranks did not complete within ",
                         timeout.count(),
                         " ms (a rank left or is stuck): ", bound.fired() ? stopped_store() : current_message()));
  }
}

}  // namespace push::dist::detail
