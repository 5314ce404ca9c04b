#pragma once
// The calls an RPC group member has sent and waits to hear back from: each under the id its
// request carries (its reply echoes it), with the member it went to and a deadline. The
// deadlines are a TimerQueue on push's Clock (core/clock.h), so a ManualClock moves them;
// the transport's I/O thread expires them on every turn and sleeps until the nearest one.
#include <push/core/future.h>

#include "core/timer_queue.h"
#include "dist/transport/wire.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace push::dist::detail {

using push::detail::Clock;

/// One call waiting for its reply.
struct Pending {
  Promise<c10::IValue> promise;
  Clock::time_point deadline;
  std::chrono::steady_clock::time_point sent;  // for RoundTrips (real time, whatever the Clock)
  int to = -1;                                 // group rank
  std::string what;                            // names the call in errors: "call of 'add' on worker1"
  /// Service and paired-value calls: sent again to the key's new holder when the one this
  /// member remembered answers that it no longer holds it.
  struct Retry {
    const char* kind = nullptr;  // "service" or "paired"
    std::string key;
    uint16_t type = 0;
    std::shared_ptr<const wire::Encoded> body;
  };
  std::optional<Retry> retry;
};

/// Thread-safe: the senders add, the I/O thread takes replies and expires deadlines.
class PendingCalls {
 public:
  struct Added {
    int64_t id;     // goes in the request's header
    bool earliest;  // its deadline is now the nearest: the I/O thread must wake to see it
  };
  Added add(Pending call);
  /// Removes the call `id` and returns it; nullopt when it is gone (it timed out, or failed)
  /// or, with `from` >= 0, went to another member (then a reply from `from` is not its reply).
  std::optional<Pending> take(int64_t id, int from = -1);
  /// Removes and returns every call waiting on member `peer`, by id.
  std::vector<Pending> take_to(int peer);
  /// Removes and returns every call, by id.
  std::vector<Pending> take_all();

  struct Expired {
    std::vector<Pending> calls;             // nearest deadline first
    std::optional<Clock::time_point> next;  // the nearest deadline left
  };
  /// Removes and returns the calls whose deadline is at or before `now`.
  Expired expire(Clock::time_point now);

 private:
  struct Entry {
    Pending call;
    push::detail::TimerQueue<int64_t>::Handle timer;
  };

  std::mutex mutex_;
  std::map<int64_t, Entry> calls_;
  push::detail::TimerQueue<int64_t> deadlines_;
  int64_t next_id_ = 0;
};

}  // namespace push::dist::detail
