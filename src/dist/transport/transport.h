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
// its loop's thread when it runs in a fiber (transport_write.cpp). The I/O thread reads:
// it assembles frames in a staging buffer, reads large tensor bytes straight into their
// tensors, and hands complete messages to the group's callbacks; it only tells waiting
// senders that a socket is writable again. It never waits on a send, so two members
// sending to each other at once cannot deadlock.
#include <ATen/core/ivalue.h>

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "dist/transport/handshake.h"
#include "dist/transport/loopback.h"
#include "dist/transport/receive_pool.h"
#include "dist/transport/shm_ring.h"
#include "dist/transport/wire.h"

namespace push::dist::detail {

class Connection;
using ConnectionPtr = std::shared_ptr<Connection>;
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
  void reply(const ConnectionPtr& to, const wire::Header& header, const wire::Encoded& body);
  /// Starts sending heartbeats and watching for silent peers (heartbeat_timeout): once every
  /// member has dialed every other, so that a member still waiting for a late one to join
  /// is not taken for silent.
  void watch_heartbeats();
  /// Makes the I/O thread call tick() again (a nearer deadline was added).
  void wake();
  /// Makes the I/O thread call tick() again by `deadline` (one was added): wakes it only
  /// when it is about to sleep past it, so that a call with a long timeout costs no wake-up.
  void wake_by(Clock::time_point deadline) {
    if (deadline.time_since_epoch().count() < sleeps_until_.load()) wake();
  }
  /// Stops the I/O thread and closes every connection. Idempotent.
  void stop();

  /// Whether nothing has come from `peer` for longer than heartbeat_timeout (never when
  /// heartbeats are off): it is stopped, hung or cut off, not merely gone after leaving.
  bool silent(int peer) const;
  /// "worker1 (rank 1)".
  std::string describe(int peer) const;
  /// The listening port (tests throw raw bytes at it).
  int port() const { return port_; }

 private:
  void loop();
  void accept_all();
  /// Registers an open connection: the I/O thread reads it from now on.
  void watch(const ConnectionPtr& c);
  /// Reads what `c` has; false when the connection must close (`why` says why).
  bool read_some(Connection& c, std::string& why);
  /// read_some for an incoming connection that has not proved itself: reads the fixed-size
  /// hello or proof only, answers the hello. False when it must close.
  bool read_handshake(Connection& c, std::string& why);
  /// Closes the handshakes past their deadline; resumes accepting after a pause. Returns
  /// the next time either needs the I/O thread.
  std::optional<Clock::time_point> expire_handshakes();
  /// Makes room for one more pending handshake (closing the oldest); false when none could
  /// be closed.
  bool evict_oldest_handshake(const char* why);
  /// Takes `c` out of pending_ (it closed, or finished its handshake).
  void forget_pending(Connection* c);
  /// Sends the heartbeats that are due and closes the connections of peers silent past
  /// heartbeat_timeout; returns when it needs the I/O thread next.
  std::optional<Clock::time_point> keep_alive();
  void heard_from(int peer);
  /// A frame's head passed its tag: acts on it (a heartbeat, a ring, a message's tensors).
  void head_opened(Connection& c);
  void deliver(Connection& c);
  void close(Connection* c, const std::string& why);
  /// Writes one whole frame, in c's write turn; ends the stream when it fails midway.
  void write_frame(Connection& c, const wire::Header& header, const wire::Encoded& body);
  /// write_frame's body: `owed` first (a heartbeat's tail), then the frame.
  void write_in_turn(Connection& c, wire::Header header, const wire::Encoded& body, std::vector<char>& owed);
  /// The data of `body` encrypted (the link leaves the host), after `head`; then its tag.
  void send_encrypted(Connection& c, std::vector<char> head, const wire::Encoded& body);
  /// Writes all of `iov` (in c's write turn); on failure ends the stream and throws.
  void send_all(Connection& c, iovec* iov, std::size_t count);
  /// Waits until `c`'s socket may take more bytes, or `deadline` (then gives up).
  void wait_writable(Connection& c, Clock::time_point deadline);
  /// The I/O thread: `c`'s socket is writable again; wakes the sender waiting for it.
  void on_writable(Connection& c);
  /// Throws push::Error naming `c`'s peer and why (write_frame then ends the stream).
  [[noreturn]] void give_up(Connection& c, const std::string& why);
  /// The next free slot of `ring`, waiting at most the send timeout for the receiver.
  char* next_slot(Connection& c, SendRing& ring);
  /// The connection's ring, made and announced on first use; null when rings do not
  /// apply to its peer or cannot be made here (then the socket carries everything).
  SendRing* ring_for(Connection& c);
  /// The tensor bytes of `body` through `ring`, one note on the stream per slot.
  void stream_through(Connection& c, SendRing& ring, const wire::Encoded& body);
  /// Handles a kRing frame's meta: maps the peer's ring. Throws push::Error.
  void open_ring(Connection& c);
  /// One note (a filled slot) has arrived: empties the slot into the frame's tensors.
  void take_slot(Connection& c, uint64_t bytes);
  ConnectionPtr dial(int peer, const std::string& address, Clock::time_point deadline, bool retry);

  TransportOptions options_;
  TransportCallbacks callbacks_;
  std::shared_ptr<ReceivePool> pool_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string address_;  // where this member listens, "a.b.c.d:port" (its handshakes prove it)
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  // When the I/O thread calls tick() next at the latest (ns on push's Clock); the largest
  // value while it is awake.
  std::atomic<int64_t> sleeps_until_{std::numeric_limits<int64_t>::max()};
  bool stopped_ = false;
  // The I/O thread's own: incoming connections still in their handshake, oldest first (one
  // leaves when it closes or is introduced), and whether accepting pauses (out of fds).
  std::deque<ConnectionPtr> pending_;
  // Connections closed during the current batch of events: kept alive until it ends, so a
  // later event of the batch for one finds it (marked gone) rather than freed memory.
  std::vector<ConnectionPtr> closed_in_batch_;
  std::optional<Clock::time_point> accept_paused_until_;
  bool accept_pause_reported_ = false;
  // Heartbeats: when each peer was last heard from (ns on push's Clock; set by dials too),
  // and when this member's next heartbeats are due (I/O thread).
  std::unique_ptr<std::atomic<int64_t>[]> last_heard_;
  std::atomic<bool> heartbeats_{false};  // watch_heartbeats() ran
  Clock::time_point next_beat_{};
  uint64_t strangers_dropped_ = 0;

  mutable std::mutex mutex_;             // guards the members below
  std::vector<ConnectionPtr> outgoing_;  // by group rank
  std::vector<std::string> addresses_;   // by group rank, for dialing again
  std::vector<std::unique_ptr<std::mutex>> dial_mutex_;
  std::vector<ConnectionPtr> all_;  // every open connection (the I/O thread closes)
  std::vector<char> same_host_;     // by group rank: rings apply
};

/// The timeout of one poll()/epoll_wait() that waits for `deadline` (on push's Clock):
/// the milliseconds left, rounded up, at most `longest_ms`; at most Clock::kManualTick
/// while a ManualClock is installed, so that the waiter notices the test moving time.
int poll_timeout_ms(Clock::time_point deadline, int longest_ms);

/// The address other members should dial this one at: 127.0.0.1 when the job's master is
/// local, the address of `interface` when given, else the address this host reaches the
/// master from.
std::string advertised_host(const std::string& master_addr, int master_port, const std::string& interface);
/// "host:port" as "a.b.c.d:port" (one spelling per address, for the handshake's proofs).
/// Throws push::Error when it is not an IPv4 address and port.
std::string canonical_address(const std::string& address);

}  // namespace push::dist::detail
