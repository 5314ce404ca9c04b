#pragma once
// The transport's listening socket and the incoming connections still in their handshake:
// at most max_pending at a time (a newcomer closes the oldest), each for at most the
// handshake timeout; when the process runs out of file descriptors, it closes the oldest
// and, with none left to close, stops accepting for 100 ms at a time. The I/O thread's alone.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/clock.h"
#include "dist/transport/poller.h"

namespace push::dist::detail {

class Connection;

class Acceptor {
 public:
  /// The tag of the listening socket's events (a connection's is its address).
  static constexpr uint64_t kTag = 0;
  using Close = std::function<void(Connection*, const std::string& why)>;
  using Open = std::function<void(std::shared_ptr<Connection>)>;

  /// `who` names this member in what it reports.
  Acceptor(std::size_t max_pending, std::chrono::milliseconds handshake_timeout, std::chrono::milliseconds send_timeout,
           std::string who);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  /// Listens on `host` (the kernel picks the port), watched by `poller`; returns where, as
  /// "a.b.c.d:port". Throws push::Error.
  std::string listen(const std::string& host, Poller& poller);
  int port() const { return port_; }
  const std::string& address() const { return address_; }
  /// Closes the listening socket.
  void close();

  /// Accepts every waiting connection, handing each to `open`; makes room with `close`.
  void accept_all(Poller& poller, const Open& open, const Close& close);
  /// Closes the handshakes past their deadline and resumes accepting after a pause; returns
  /// when it needs the I/O thread next.
  std::optional<push::detail::Clock::time_point> expire(Poller& poller, const Close& close);
  /// `c` closed, or finished its handshake: it is pending no more.
  void forget(Connection* c);
  /// Counts a stranger dropped; whether to say so (the first three, then every 1000th: a
  /// flood of strangers must not become a flood of lines). `count` is the count so far.
  bool report_stranger(uint64_t& count);

 private:
  /// Closes the oldest pending connection; false when there is none.
  bool evict_oldest(const Close& close, const char* why);

  const std::size_t max_pending_;
  const std::chrono::milliseconds handshake_timeout_;
  const std::chrono::milliseconds send_timeout_;
  const std::string who_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string address_;
  std::deque<std::shared_ptr<Connection>> pending_;  // oldest first
  std::optional<push::detail::Clock::time_point> paused_until_;
  bool pause_reported_ = false;
  uint64_t strangers_dropped_ = 0;
};

}  // namespace push::dist::detail
