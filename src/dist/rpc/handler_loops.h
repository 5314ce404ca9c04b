#pragma once
// The event loops an RPC group runs its incoming requests on (core/event_loop.h), each
// request as a fiber, so that a handler that waits for another call (to any member, itself
// included) suspends instead of holding a thread.
#include "core/event_loop.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace push::dist::detail {

/// start() and stop() are the group's (once each); enqueue() and is_own_thread() are
/// thread-safe in between.
class HandlerLoops {
 public:
  /// Starts `count` loops for group `group`. `report` hears of what a job lets escape (or
  /// of its cancellation, when the loops stop first).
  void start(int count, const std::string& group, std::function<void(std::exception_ptr)> report);
  /// Runs `job` as a fiber: on `peer`'s loop for its requests (its thread stays warm, its
  /// calls start in order), else on the next loop round robin.
  void enqueue(std::function<void()> job, int peer = -1);
  /// Cancels what is queued, unwinds waiting fibers, joins. Not from a loop's own thread.
  void stop();
  /// Whether the calling thread is one of the loops'.
  bool is_own_thread() const;

 private:
  std::vector<std::shared_ptr<push::detail::EventLoop>> loops_;
  std::function<void(std::exception_ptr)> report_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace push::dist::detail
