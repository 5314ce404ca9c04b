#pragma once
// The RPC transport: TCP connections that stay open, one frame per message (wire.h), one
// I/O thread per group that reads every connection with epoll.
//
// Each member listens on a port of its own and dials every other member once: a member's
// requests, and the replies to them, travel on the connection it dialed ("outgoing"); the
// requests of a peer arrive on the connection that peer dialed ("incoming") and are
// answered on it. So a reply never waits behind a request going the other way, and the
// end of an outgoing connection means exactly: the calls pending on that peer will not
// be answered (peer_lost fails them at once; the next call dials again).
//
// Senders write from their own thread with sendmsg of gathered buffers (header, meta,
// each tensor's storage): no copy of the meta or tensor bytes and no thread hop. They take
// turns per connection, and one whose peer does not take the bytes waits without holding
// its loop's thread when it runs in a fiber (sender.h, write_side.h). The I/O thread
// (io_loop.h) reads: each connection's handshake (incoming_handshake.h), then its
// frames (frame_reader.h), and hands complete messages to the group's callbacks; it only
// tells waiting senders that a socket is writable again. It never waits on a send, so two
// members sending to each other at once cannot deadlock.
//
// Transport composes its parts and owns no socket itself: the poller (what the I/O thread
// sleeps on), the acceptor (the listening socket, the handshakes in progress), the peer
// table (every connection, by rank the ones it dialed, behind one lock), the heartbeats,
// the sender and the I/O thread (io_loop.h); dialer.h dials. Each connection (connection.h)
// keeps its senders' state private behind its own lock (write_side.h).
#include <ATen/core/ivalue.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "dist/transport/acceptor.h"
#include "dist/transport/handshake.h"
#include "dist/transport/heartbeats.h"
#include "dist/transport/incoming_handshake.h"
#include "dist/transport/io_loop.h"
#include "dist/transport/loopback.h"
#include "dist/transport/peer_table.h"
#include "dist/transport/poller.h"
#include "dist/transport/receive_pool.h"
#include "dist/transport/sender.h"
#include "dist/transport/shm_ring.h"
#include "dist/transport/sockets.h"
#include "dist/transport/wire.h"

namespace push::dist::detail {

using push::detail::Clock;

struct TransportOptions {
  handshake::Bytes key{};  // the group's key: a connection that cannot prove it holds it is closed
  int rank = -1;           // this member's group rank
  int size = 0;            // members in the group
  uint64_t max_message_bytes = 0;
  std::size_t receive_pool_bytes = 0;  // freed large receive buffers kept for reuse
  // Shared-memory rings to members with this host_identity() (shm_ring.h): messages with
  // at least ring_min_bytes of tensor data go through them.
  bool shared_memory = false;
  uint64_t ring_slot_bytes = uint64_t{1} << 20;
  uint32_t ring_slots = 16;
  uint64_t ring_min_bytes = uint64_t{256} << 10;
  std::chrono::milliseconds send_timeout{0};
  // Connections that have not finished the handshake: at most max_pending at a time (a new
  // one closes the oldest), each for at most handshake_timeout.
  std::size_t max_pending = 64;
  std::chrono::milliseconds handshake_timeout{10000};
  // A peer that sends nothing for this long is lost (peer_lost); every quarter of it this
  // member sends each peer a heartbeat on the connection it dialed. 0: off.
  std::chrono::milliseconds heartbeat_timeout{0};
  std::vector<std::string> names;  // of each group rank, for errors: "worker1 (rank 1)"

  /// This member's name: "worker0".
  std::string self() const;
  /// "worker1 (rank 1 of the group)".
  std::string describe(int peer) const;
};

struct TransportCallbacks {
  /// A request from group rank `peer` arrived on `from`; answer with Transport::reply.
  /// `value` is null and `error` set when its frame was intact but its value malformed.
  std::function<void(ConnectionPtr from, int peer, const wire::Header&, c10::IValue value, std::exception_ptr error)>
      request;
  /// A reply from `peer`; `error` set when it was malformed.
  std::function<void(int peer, const wire::Header&, c10::IValue value, std::exception_ptr error)> reply;
  /// The connection this member dialed to `peer` ended (the peer died, left, or sent bytes
  /// that are not frames): nothing pending there will be answered.
  std::function<void(int peer, const std::string& why)> peer_lost;
  /// A call dialed `peer` again after its connection was lost, and it answered.
  std::function<void(int peer)> peer_found;
  /// Called by the I/O thread on every turn: the next deadline it should wake up for.
  std::function<std::optional<Clock::time_point>()> tick;
};

class Transport {
 public:
  Transport(TransportOptions options, TransportCallbacks callbacks);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// Opens the listening socket on `host` (port chosen by the kernel); returns "host:port".
  std::string listen(const std::string& host);
  /// Starts the I/O thread.
  void start();
  /// Dials `peer` at "host:port", retrying refused connections until `deadline`, and
  /// introduces this member. `identity` is the peer's host_identity(): equal to this
  /// process's, large messages between the two go through shared memory. Throws
  /// push::Error naming the peer.
  void connect(int peer, const std::string& address, const std::string& identity, Clock::time_point deadline);
  /// Sends a request to `peer` on the connection this member dialed (dialing again, once,
  /// when it was lost). Throws push::Error naming the peer.
  void send(int peer, const wire::Header& header, const wire::Encoded& body);
  /// Answers on the connection a request came in on. Throws push::Error.
  void reply(const ConnectionPtr& to, const wire::Header& header, const wire::Encoded& body) {
    sender_.write_frame(*to, header, body);
  }
  /// Starts sending heartbeats and watching for silent peers (heartbeat_timeout): once every
  /// member has dialed every other, so that a member still waiting for a late one to join
  /// is not taken for silent.
  void watch_heartbeats();
  /// Makes the I/O thread call tick() again by `deadline` (one was added).
  void wake_by(Clock::time_point deadline) { poller_.wake_by(deadline); }
  /// Stops the I/O thread and closes every connection. Idempotent.
  void stop();

  /// Whether nothing has come from `peer` for longer than heartbeat_timeout (never when
  /// heartbeats are off): it is stopped, hung or cut off, not merely gone after leaving.
  bool silent(int peer) const { return heartbeats_.silent(peer); }
  /// The listening port (tests throw raw bytes at it).
  int port() const { return acceptor_.port(); }

 private:
  /// Dials `peer` and watches the connection (dialer.h).
  ConnectionPtr dial(int peer, const std::string& address, Clock::time_point deadline, bool retry);

  TransportOptions options_;
  TransportCallbacks callbacks_;
  std::shared_ptr<ReceivePool> pool_;
  Poller poller_;
  Acceptor acceptor_;
  ListenerIdentity identity_;  // as this member's handshakes prove it, once it listens
  PeerTable peers_;
  Heartbeats heartbeats_;
  Sender sender_;
  IoLoop loop_;  // last: it works on the parts above
};

}  // namespace push::dist::detail
