#include "dist/transport/transport.h"

#include <push/core/errors.h>

#include "dist/transport/connection.h"
#include "dist/transport/dialer.h"
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
      sender_(options_, poller_, peers_),
      loop_(LoopParts{options_, callbacks_, *pool_, poller_, acceptor_, identity_, peers_, heartbeats_, sender_}) {}

Transport::~Transport() { stop(); }

std::string Transport::listen(const std::string& host) {
  identity_ = ListenerIdentity{options_.key, options_.rank, options_.size, acceptor_.listen(host, poller_)};
  return identity_.address;
}

void Transport::start() { loop_.start(); }

void Transport::stop() { loop_.stop(); }

ConnectionPtr Transport::dial(int peer, const std::string& address, Clock::time_point deadline, bool retry) {
  ConnectionPtr c = dial_member(options_, *pool_, peer, address, deadline, retry);
  heartbeats_.heard_from(peer);
  loop_.watch(c);
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
      PUSH_CHECK(!loop_.stopping(), kRpcOrigin, "the group is shut down");
      c = dial(peer, peers_.address(peer), Clock::deadline_after(options_.send_timeout), /*retry=*/false);
      peers_.redialed(peer, c);
      if (callbacks_.peer_found) callbacks_.peer_found(peer);
    }
  }
  sender_.write_frame(*c, header, body);
}

void Transport::watch_heartbeats() {
  heartbeats_.start();
  poller_.wake();
}

}  // namespace push::dist::detail
