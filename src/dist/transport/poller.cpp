#include "dist/transport/poller.h"

#include <push/core/errors.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"

namespace push::dist::detail {

using push::detail::Clock;

namespace {
constexpr uint64_t kWakeTag = 1;  // a connection's tag is its address, never 1
}  // namespace

Poller::Poller() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    const int error = errno;
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    PUSH_CHECK(false, kRpcOrigin, "cannot create an epoll instance: ", std::strerror(error));
  }
  add(wake_fd_, kWakeTag, EPOLLIN);
}

Poller::~Poller() {
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void Poller::add(int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void Poller::modify(int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void Poller::remove(int fd) { ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr); }

void Poller::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

int Poller::wait(epoll_event* events, int max, std::optional<Clock::time_point> next) {
  // 1 s at most, so that a stop is seen; 1 ms with a ManualClock, so that a deadline the
  // test moves past is seen.
  const int timeout_ms = next ? poll_timeout_ms(*next, 1000) : 1000;
  sleeps_until_.store((Clock::now() + std::chrono::milliseconds(timeout_ms)).time_since_epoch().count());
  const int n = ::epoll_wait(epoll_fd_, events, max, timeout_ms);
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWakeTag) {
      uint64_t count;
      [[maybe_unused]] auto r = ::read(wake_fd_, &count, sizeof(count));
      continue;
    }
    events[kept++] = events[i];
  }
  return kept;
}

}  // namespace push::dist::detail
