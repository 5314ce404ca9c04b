#pragma once
// A barrier on the job's store, for World::barrier and each RPC group (its barrier() and
// the barrier that ends it).
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>

namespace push::dist::detail {

/// A barrier on the store that works any number of times in a row: generation g uses its
/// own keys, so a fast rank entering g+1 can never be confused with a slow one leaving g.
/// Blocking waits use a store client of their own, so they never hold up other store users.
/// Every call ends by its timeout (and a little more) even when the store at `host`:`port`
/// stops answering (rank 0 stopped: LibTorch 1.13's client has no deadline of its own;
/// store_deadline.h).
class StoreBarrier {
 public:
  StoreBarrier(c10::intrusive_ptr<c10d::Store> waiter, std::string prefix, int size, std::string host, int port)
      : waiter_(std::move(waiter)), prefix_(std::move(prefix)), size_(size), host_(std::move(host)), port_(port) {}
  /// `origin` names the caller in the error thrown when `timeout` runs out.
  void arrive_and_wait(std::chrono::milliseconds timeout, const char* origin);
  /// Like arrive_and_wait for member `rank`, but it does not wait for the members `lost()`
  /// names (asked again while waiting: a member may be found lost meanwhile): it returns
  /// once every other member has arrived. It polls the store every 20 ms on push's Clock
  /// (core/clock.h): with a ManualClock installed, only moving that clock ends its wait.
  /// `store_lost`, when given, says whether the store's host (rank 0) is known to be
  /// stopped or cut off: then the wait ends at once, failing.
  void arrive_and_wait_for_live(int rank, std::chrono::milliseconds timeout, const char* origin,
                                const std::function<std::set<int>()>& lost,
                                const std::function<bool()>& store_lost = nullptr);

 private:
  std::mutex mutex_;  // one barrier at a time per object: generations stay in order
  c10::intrusive_ptr<c10d::Store> waiter_;
  std::string prefix_;
  int size_;
  std::string host_;
  int port_;
  int64_t generation_ = 0;
};

}  // namespace push::dist::detail
