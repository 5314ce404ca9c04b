#pragma once
// The transport's sending side: whole frames, one sender at a time per connection, and no
// thread held while a peer does not take the bytes.
//
// A sender writes with non-blocking sendmsg calls straight from its own thread (no copy,
// no thread hop). When the socket is full it waits for the I/O thread to see the socket
// writable again (EPOLLOUT); when a shared-memory ring is full it waits for the receiver a
// millisecond at a time. Inside a fiber (an RPC handler answering, a particle's handler
// sending) both waits suspend the fiber, so the loop goes on serving other peers while one
// peer reads slowly or not at all; a plain thread blocks as before. A wait that sees no
// progress for the send timeout ends the connection.
#include <sys/uio.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/clock.h"
#include "dist/transport/wire.h"
#include "dist/transport/write_side.h"

namespace push::dist::detail {

class Connection;
class PeerTable;
class Poller;
struct TransportOptions;

class Sender {
 public:
  Sender(const TransportOptions& options, Poller& poller, const PeerTable& peers)
      : options_(options), poller_(poller), peers_(peers) {}

  /// Writes one whole frame on `c`, in its turn; ends the stream when it fails midway.
  /// Throws push::Error naming the peer.
  void write_frame(Connection& c, const wire::Header& header, const wire::Encoded& body) const;
  /// The I/O thread: `c`'s socket is writable again; wakes the sender waiting for it.
  void on_writable(Connection& c) const;

 private:
  /// write_frame's body: what a heartbeat owed first, then the frame.
  void write_in_turn(Connection& c, WriteSide::Turn& turn, wire::Header header, const wire::Encoded& body) const;
  /// The data of `body` encrypted (the link leaves the host), after `head`; then its tag.
  void send_encrypted(Connection& c, FrameSeal& seal, std::vector<char> head, const wire::Encoded& body) const;
  /// Writes all of `iov` (in c's write turn); on failure throws.
  void send_all(Connection& c, iovec* iov, std::size_t count) const;
  /// Waits until `c`'s socket may take more bytes, or `deadline` (then gives up).
  void wait_writable(Connection& c, push::detail::Clock::time_point deadline) const;
  /// Throws push::Error naming `c`'s peer and why (write_frame then ends the stream).
  [[noreturn]] void give_up(const Connection& c, const std::string& why) const;
  /// The connection's ring, made and announced on first use; null when rings do not
  /// apply to its peer or cannot be made here (then the socket carries everything).
  SendRing* ring_for(Connection& c, WriteSide::Turn& turn) const;
  /// The next free slot of `ring`, waiting at most the send timeout for the receiver.
  char* next_slot(Connection& c, SendRing& ring) const;
  /// The tensor bytes of `body` through `ring`, one note on the stream per slot.
  void stream_through(Connection& c, WriteSide::Turn& turn, SendRing& ring, const wire::Encoded& body) const;

  const TransportOptions& options_;
  Poller& poller_;
  const PeerTable& peers_;
};

}  // namespace push::dist::detail
