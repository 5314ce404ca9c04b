#include "dist/transport/io_loop.h"

#include <push/core/errors.h>

#include <sys/epoll.h>
#include <sys/socket.h>

#include <iostream>

#include "dist/transport/rpc_origin.h"
#include "dist/transport/transport.h"

namespace push::dist::detail {

void IoLoop::start() {
  thread_ = std::thread([this] { run(); });
}

void IoLoop::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  parts_.poller.wake();
  if (thread_.joinable()) thread_.join();
  for (auto& c : parts_.peers.take_all()) close(c.get(), "the group shut down");
  closed_in_batch_.clear();
  parts_.acceptor.close();
}

void IoLoop::run() {
  const Acceptor::Close close_one = [this](Connection* c, const std::string& why) { close(c, why); };
  const Acceptor::Open open_one = [this](ConnectionPtr c) { watch(c); };
  epoll_event events[64];
  while (!stopping_) {
    // Asleep at most until the nearest deadline: the calls' (tick), the handshakes' and an
    // accept pause's, the heartbeats'.
    parts_.poller.awake();
    closed_in_batch_.clear();
    auto next = parts_.callbacks.tick();
    for (const auto& wake : {parts_.acceptor.expire(parts_.poller, close_one), keep_alive()}) {
      if (wake && (!next || *wake < *next)) next = wake;
    }
    const int n = parts_.poller.wait(events, 64, next);
    for (int i = 0; i < n && !stopping_; ++i) {
      if (events[i].data.u64 == Acceptor::kTag) {
        parts_.acceptor.accept_all(parts_.poller, open_one, close_one);
        continue;
      }
      auto* c = static_cast<Connection*>(events[i].data.ptr);
      if (c->gone()) continue;  // closed earlier in this batch (kept alive until it ends)
      if ((events[i].events & EPOLLOUT) != 0) parts_.sender.on_writable(*c);
      if ((events[i].events & ~static_cast<uint32_t>(EPOLLOUT)) == 0) continue;
      std::string why;
      if (!read_some(*c, why)) close(c, why);
    }
  }
}

void IoLoop::watch(const ConnectionPtr& c) {
  parts_.peers.add(c);
  parts_.poller.add(c->fd(), reinterpret_cast<uint64_t>(c.get()), EPOLLIN | EPOLLRDHUP);
}

bool IoLoop::read_some(Connection& c, std::string& why) {
  try {
    if (!c.introduced()) {
      switch (c.handshake().read(c.fd(), parts_.identity, why)) {
        case IncomingHandshake::Step::kWaiting:
          return true;
        case IncomingHandshake::Step::kEnded:
          return false;
        case IncomingHandshake::Step::kProved:
          break;
      }
      const auto keys = c.handshake().keys(parts_.identity);
      c.introduce(keys, handshake::encrypts(parts_.identity.address), &parts_.pool, parts_.options.max_message_bytes);
      parts_.acceptor.forget(&c);
    }
    parts_.heartbeats.heard_from(c.peer());  // bytes (or an end) from the peer: it is alive enough to send
    const TransportCallbacks& callbacks = parts_.callbacks;
    const FrameReader::Deliver deliver = [&](const wire::Header& header, c10::IValue value, std::exception_ptr error) {
      if (c.outgoing()) {
        PUSH_CHECK(wire::is_reply(header.type), kRpcOrigin, "malformed frame: a request (type ", header.type,
                   ") where only replies are expected");
        callbacks.reply(c.peer(), header, std::move(value), std::move(error));
      } else {
        PUSH_CHECK(wire::is_request(header.type), kRpcOrigin, "malformed frame: a reply (type ", header.type,
                   ") where only requests are expected");
        callbacks.request(c.shared_from_this(), c.peer(), header, std::move(value), std::move(error));
      }
    };
    return c.reader().read(c.fd(), deliver, why);
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

std::optional<push::detail::Clock::time_point> IoLoop::keep_alive() {
  bool due = false;
  const auto next = parts_.heartbeats.round(due);
  if (!due) return next;
  const std::vector<ConnectionPtr> out = parts_.peers.outgoing_all();
  char head[wire::kHeaderBytes];
  wire::Header h;
  h.type = wire::kHeartbeat;
  wire::write_header(h, head);
  for (const auto& c : out) {
    if (c) c->writer().beat(head, sizeof(head));
  }
  for (const auto& c : out) {
    if (!c || !parts_.heartbeats.silent(c->peer())) continue;
    const std::string why = c10::str("nothing heard from it for ", parts_.heartbeats.timeout().count(),
                                     " ms (heartbeat_timeout): it is stopped, hung or cut off");
    // Its own connections too: a reply blocked on one (the peer stopped reading) fails now,
    // and frees the handler loop it holds.
    for (const auto& in : parts_.peers.incoming_from(c->peer())) close(in.get(), why);
    close(c.get(), why);
  }
  return next;
}

void IoLoop::close(Connection* c, const std::string& why) {
  // Alive until the I/O thread's current batch of events ends (closed_in_batch_).
  closed_in_batch_.push_back(c->shared_from_this());
  const bool lost = parts_.peers.remove(c);
  if (!c->outgoing() && !c->introduced()) parts_.acceptor.forget(c);
  c->set_gone();
  parts_.poller.remove(c->fd());
  ::shutdown(c->fd(), SHUT_RDWR);  // unblocks a sender
  c->writer().close();
  if (stopping_) return;
  const TransportOptions& options = parts_.options;
  if (!c->outgoing() && !c->introduced()) {
    uint64_t dropped = 0;
    if (parts_.acceptor.report_stranger(dropped)) {
      std::cerr << "[push::dist::RpcGroup] " << options.self()
                << ": dropped a connection that did not prove it is a member of the group (" << dropped
                << " so far): " << why << "\n";
    }
  } else if (!c->outgoing() && why != "the peer closed the connection") {
    std::cerr << "[push::dist::RpcGroup] " << options.self() << ": closed the connection from "
              << options.describe(c->peer()) << ": " << why << "\n";
  }
  if (lost) parts_.callbacks.peer_lost(c->peer(), why);
}

}  // namespace push::dist::detail
