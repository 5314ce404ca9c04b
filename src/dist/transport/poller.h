#pragma once
// What the transport's I/O thread sleeps on: an epoll instance over its sockets, and an
// eventfd that wakes it when a nearer deadline was added (wake, wake_by).
#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>

#include "core/clock.h"

namespace push::dist::detail {

class Poller {
 public:
  /// Throws push::Error when the kernel gives no epoll instance or eventfd.
  Poller();
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  /// Watches `fd` for `events`; its events carry `tag` (a number, or a connection's address).
  void add(int fd, uint64_t tag, uint32_t events);
  void modify(int fd, uint64_t tag, uint32_t events);
  void remove(int fd);

  /// Waits for events until `next` (1 s at most), filling `events`; returns how many. The
  /// wake-ups of wake() are taken here and not returned.
  int wait(epoll_event* events, int max, std::optional<push::detail::Clock::time_point> next);
  /// The I/O thread is awake: any new deadline wakes it (it may have read them before it came).
  void awake() { sleeps_until_.store(std::numeric_limits<int64_t>::max()); }
  /// Makes wait() return now.
  void wake();
  /// Makes wait() return by `deadline`: wakes it only when it would sleep past it, so that
  /// a call with a long timeout costs no wake-up.
  void wake_by(push::detail::Clock::time_point deadline) {
    if (deadline.time_since_epoch().count() < sleeps_until_.load()) wake();
  }

 private:
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  // When wait() returns at the latest (ns on push's Clock); the largest value while awake.
  std::atomic<int64_t> sleeps_until_{std::numeric_limits<int64_t>::max()};
};

}  // namespace push::dist::detail
