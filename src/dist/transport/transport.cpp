#include "dist/transport/transport.h"

#include <push/core/errors.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "dist/transport/connection.h"
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {

std::string TransportOptions::self() const {
  const auto at = static_cast<std::size_t>(rank);
  return rank >= 0 && at < names.size() ? names[at] : std::string("this member");
}

std::string TransportOptions::describe(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(names.size())) return "an unknown peer";
  return c10::str(names[static_cast<std::size_t>(peer)], " (rank ", peer, " of the group)");
}

Transport::Transport(TransportOptions options, TransportCallbacks callbacks)
    : options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      pool_(std::make_shared<ReceivePool>(options_.receive_pool_bytes)),
      acceptor_(options_.max_pending, options_.handshake_timeout, options_.send_timeout, options_.self()),
      peers_(options_.size),
      heartbeats_(options_.size, options_.heartbeat_timeout),
      sender_(options_, poller_, peers_) {}

Transport::~Transport() { stop(); }

std::string Transport::listen(const std::string& host) {
  identity_ = ListenerIdentity{options_.key, options_.rank, options_.size, acceptor_.listen(host, poller_)};
  return identity_.address;
}

void Transport::start() {
  thread_ = std::thread([this] { loop(); });
}

void Transport::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  poller_.wake();
  if (thread_.joinable()) thread_.join();
  for (auto& c : peers_.take_all()) close(c.get(), "the group shut down");
  closed_in_batch_.clear();
  acceptor_.close();
}

// -- dialing and sending ------------------------------------------------------------------

ConnectionPtr Transport::dial(int peer, const std::string& address, Clock::time_point deadline, bool retry) {
  const sockaddr_in sa = parse_address(address);
  const std::string listener = canonical_address(address);  // as the handshake proves it
  ConnectionPtr c;
  int error = 0;
  auto cannot = [&] {
    return Error(c10::str("[", kRpcOrigin, "] cannot connect to ", options_.describe(peer), " at ", address, ": ",
                          std::strerror(error)));
  };
  // A refused connection is tried again every 20 ms until the deadline: the peer may not
  // listen yet.
  const bool connected = Clock::poll_until(deadline, std::chrono::milliseconds(20), [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    PUSH_CHECK(fd >= 0, kRpcOrigin, "cannot open a socket: ", std::strerror(errno));
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
    error = rc == 0 ? 0 : errno;
    if (error == EINPROGRESS) error = finish_connect(fd, deadline);
    if (error != 0) {
      ::close(fd);
      if (!retry || (error != ECONNREFUSED && error != EAGAIN)) throw cannot();
      return false;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // sends block; reads use MSG_DONTWAIT
    set_member_socket_options(fd, options_.send_timeout);
    handshake::SessionKeys keys;
    try {
      // At least a second for the handshake, however little of the dial's time is left.
      keys =
          handshake::dial(fd, options_.key, options_.rank, peer, listener,
                          std::max(deadline, Clock::deadline_after(std::chrono::seconds(1))), options_.describe(peer));
    } catch (...) {
      ::close(fd);
      throw;
    }
    c = std::make_shared<Connection>(fd, peer, keys, handshake::encrypts(listener), pool_.get(),
                                     options_.max_message_bytes);
    heartbeats_.heard_from(peer);
    watch(c);
    return true;
  });
  if (!connected) throw cannot();
  return c;
}

void Transport::connect(int peer, const std::string& address, const std::string& identity, Clock::time_point deadline) {
  auto c = dial(peer, address, deadline, /*retry=*/true);
  peers_.connected(peer, address, options_.shared_memory && identity == host_identity(), std::move(c));
}

void Transport::send(int peer, const wire::Header& header, const wire::Encoded& body) {
  ConnectionPtr c = peers_.outgoing(peer);
  if (!c) {
    // The connection was lost: dial once more (a dead peer refuses at once).
    std::lock_guard<std::mutex> redialing(peers_.redial_mutex(peer));
    c = peers_.outgoing(peer);
    if (!c) {
      PUSH_CHECK(!stopping_, kRpcOrigin, "the group is shut down");
      c = dial(peer, peers_.address(peer), Clock::deadline_after(options_.send_timeout), /*retry=*/false);
      peers_.redialed(peer, c);
      if (callbacks_.peer_found) callbacks_.peer_found(peer);
    }
  }
  sender_.write_frame(*c, header, body);
}

// -- heartbeats ---------------------------------------------------------------------------

void Transport::watch_heartbeats() {
  heartbeats_.start();
  poller_.wake();
}

std::optional<Clock::time_point> Transport::keep_alive() {
  bool due = false;
  const auto next = heartbeats_.round(due);
  if (!due) return next;
  const std::vector<ConnectionPtr> out = peers_.outgoing_all();
  char head[wire::kHeaderBytes];
  wire::Header h;
  h.type = wire::kHeartbeat;
  wire::write_header(h, head);
  for (const auto& c : out) {
    if (c) c->writer().beat(head, sizeof(head));
  }
  for (const auto& c : out) {
    if (!c || !heartbeats_.silent(c->peer())) continue;
    const std::string why = c10::str("nothing heard from it for ", heartbeats_.timeout().count(),
                                     " ms (heartbeat_timeout): it is stopped, hung or cut off");
    // Its own connections too: a reply blocked on one (the peer stopped reading) fails now,
    // and frees the handler loop it holds.
    for (const auto& in : peers_.incoming_from(c->peer())) close(in.get(), why);
    close(c.get(), why);
  }
  return next;
}

// -- closing ------------------------------------------------------------------------------

void Transport::close(Connection* c, const std::string& why) {
  // Alive until the I/O thread's current batch of events ends (closed_in_batch_).
  closed_in_batch_.push_back(c->shared_from_this());
  const bool lost = peers_.remove(c);
  if (!c->outgoing() && !c->introduced()) acceptor_.forget(c);
  c->set_gone();
  poller_.remove(c->fd());
  ::shutdown(c->fd(), SHUT_RDWR);  // unblocks a sender
  c->writer().close();
  if (stopping_) return;
  if (!c->outgoing() && !c->introduced()) {
    uint64_t dropped = 0;
    if (acceptor_.report_stranger(dropped)) {
      std::cerr << "[push::dist::RpcGroup] " << options_.self()
                << ": dropped a connection that did not prove it is a member of the group (" << dropped
                << " so far): " << why << "\n";
    }
  } else if (!c->outgoing() && why != "the peer closed the connection") {
    std::cerr << "[push::dist::RpcGroup] " << options_.self() << ": closed the connection from "
              << options_.describe(c->peer()) << ": " << why << "\n";
  }
  if (lost) callbacks_.peer_lost(c->peer(), why);
}

}  // namespace push::dist::detail
