#pragma once
// The transport's I/O thread: waits on every connection with epoll (the poller), accepts
// (the acceptor), reads each connection's handshake or frames and hands complete messages
// to the group's callbacks, sends the heartbeats that are due, and closes what must close.
// It tells waiting senders that a socket is writable again, and never waits on a send.
//
// It works on the transport's parts, which the transport owns; watch() and close() are
// how a connection starts and ends being read, from any thread before start() and after
// stop(), and from the I/O thread in between.
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "dist/transport/acceptor.h"
#include "dist/transport/connection.h"
#include "dist/transport/heartbeats.h"
#include "dist/transport/incoming_handshake.h"
#include "dist/transport/peer_table.h"
#include "dist/transport/poller.h"
#include "dist/transport/receive_pool.h"
#include "dist/transport/sender.h"

namespace push::dist::detail {

struct TransportOptions;
struct TransportCallbacks;

/// What the I/O thread works on: the transport's own parts.
struct LoopParts {
  const TransportOptions& options;
  const TransportCallbacks& callbacks;
  ReceivePool& pool;
  Poller& poller;
  Acceptor& acceptor;
  const ListenerIdentity& identity;  // as this member's handshakes prove it
  PeerTable& peers;
  Heartbeats& heartbeats;
  Sender& sender;
};

class IoLoop {
 public:
  explicit IoLoop(LoopParts parts) : parts_(parts) {}
  ~IoLoop() { stop(); }
  IoLoop(const IoLoop&) = delete;
  IoLoop& operator=(const IoLoop&) = delete;

  void start();
  /// Stops the thread and closes every connection. Idempotent.
  void stop();
  bool stopping() const { return stopping_; }
  /// Reads `c` from now on.
  void watch(const ConnectionPtr& c);
  /// Ends `c`: no more reads or sends; a lost outgoing connection is reported (peer_lost).
  void close(Connection* c, const std::string& why);

 private:
  void run();
  /// Reads what `c` has; false when the connection must close (`why` says why).
  bool read_some(Connection& c, std::string& why);
  /// Sends the heartbeats that are due and closes the connections of peers silent past
  /// the heartbeat timeout; returns when it needs the I/O thread next.
  std::optional<push::detail::Clock::time_point> keep_alive();

  LoopParts parts_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  // Connections closed during the current batch of events: kept alive until it ends, so a
  // later event of the batch for one finds it (marked gone) rather than freed memory.
  std::vector<ConnectionPtr> closed_in_batch_;
};

}  // namespace push::dist::detail
