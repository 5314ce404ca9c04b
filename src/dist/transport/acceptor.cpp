#include "dist/transport/acceptor.h"

#include <push/core/errors.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "dist/transport/connection.h"
#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"

namespace push::dist::detail {

using push::detail::Clock;

Acceptor::Acceptor(std::size_t max_pending, std::chrono::milliseconds handshake_timeout,
                   std::chrono::milliseconds send_timeout, std::string who)
    : max_pending_(max_pending),
      handshake_timeout_(handshake_timeout),
      send_timeout_(send_timeout),
      who_(std::move(who)) {}

Acceptor::~Acceptor() { close(); }

std::string Acceptor::listen(const std::string& host, Poller& poller) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  PUSH_CHECK(listen_fd_ >= 0, kRpcOrigin, "cannot open a socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = parse_address(host + ":0");
  PUSH_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0, kRpcOrigin, "cannot listen on ",
             host, ": ", std::strerror(errno));
  PUSH_CHECK(::listen(listen_fd_, 128) == 0, kRpcOrigin, "cannot listen on ", host, ": ", std::strerror(errno));
  socklen_t len = sizeof(sa);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  poller.add(listen_fd_, kTag, EPOLLIN);
  address_ = canonical_address(c10::str(host, ":", port_));
  return address_;
}

void Acceptor::close() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void Acceptor::accept_all(Poller& poller, const Open& open, const Close& close) {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      // Out of file descriptors (or buffers): the listening socket stays ready, so epoll
      // would wake this thread again at once. Close the oldest unproved connection and try
      // again; when there is none, stop accepting for a while.
      const int error = errno;
      if ((error == EMFILE || error == ENFILE) && evict_oldest(close, "out of file descriptors")) continue;
      paused_until_ = Clock::deadline_after(std::chrono::milliseconds(100));
      poller.modify(listen_fd_, kTag, 0);
      if (!pause_reported_) {
        pause_reported_ = true;
        std::cerr << "[push::dist::RpcGroup] " << who_ << ": cannot accept connections (" << std::strerror(error)
                  << "): pausing 100 ms at a time\n";
      }
      return;
    }
    set_member_socket_options(fd, send_timeout_);
    auto c = std::make_shared<Connection>(fd, Clock::deadline_after(handshake_timeout_));
    while (pending_.size() >= max_pending_ && evict_oldest(close, "too many connections in their handshake")) {
    }
    pending_.push_back(c);
    open(std::move(c));
  }
}

void Acceptor::forget(Connection* c) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.get() == c; });
  if (it != pending_.end()) pending_.erase(it);
}

bool Acceptor::evict_oldest(const Close& close, const char* why) {
  if (pending_.empty()) return false;
  auto c = pending_.front();  // close() forgets it
  close(c.get(), why);
  return true;
}

bool Acceptor::report_stranger(uint64_t& count) {
  count = ++strangers_dropped_;
  return count <= 3 || count % 1000 == 0;
}

std::optional<Clock::time_point> Acceptor::expire(Poller& poller, const Close& close) {
  const auto now = Clock::now();
  std::optional<Clock::time_point> next;
  if (paused_until_) {
    if (now >= *paused_until_) {
      paused_until_.reset();
      poller.modify(listen_fd_, kTag, EPOLLIN);
    } else {
      next = paused_until_;
    }
  }
  // Deadlines grow with accept order: the expired ones are at the front.
  while (!pending_.empty()) {
    auto c = pending_.front();
    const auto deadline = c->handshake().deadline();
    if (deadline > now) {
      if (!next || deadline < *next) next = deadline;
      break;
    }
    close(c.get(), "no handshake within the handshake timeout");  // forgets it
  }
  return next;
}

}  // namespace push::dist::detail
