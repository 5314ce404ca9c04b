// The transport's I/O thread: waits on every connection with epoll, accepts, reads each
// connection's handshake or frames, hands complete messages on, and closes what must close.
#include "dist/transport/transport.h"

#include <push/core/errors.h>

#include <sys/epoll.h>

#include "dist/transport/connection.h"
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {

void Transport::loop() {
  const Acceptor::Close close_one = [this](Connection* c, const std::string& why) { close(c, why); };
  const Acceptor::Open open_one = [this](ConnectionPtr c) { watch(c); };
  epoll_event events[64];
  while (!stopping_) {
    // Asleep at most until the nearest deadline: the calls' (tick), the handshakes' and an
    // accept pause's, the heartbeats'.
    poller_.awake();
    closed_in_batch_.clear();
    auto next = callbacks_.tick();
    for (const auto& wake : {acceptor_.expire(poller_, close_one), keep_alive()}) {
      if (wake && (!next || *wake < *next)) next = wake;
    }
    const int n = poller_.wait(events, 64, next);
    for (int i = 0; i < n && !stopping_; ++i) {
      if (events[i].data.u64 == Acceptor::kTag) {
        acceptor_.accept_all(poller_, open_one, close_one);
        continue;
      }
      auto* c = static_cast<Connection*>(events[i].data.ptr);
      if (c->gone()) continue;  // closed earlier in this batch (kept alive until it ends)
      if ((events[i].events & EPOLLOUT) != 0) sender_.on_writable(*c);
      if ((events[i].events & ~static_cast<uint32_t>(EPOLLOUT)) == 0) continue;
      std::string why;
      if (!read_some(*c, why)) close(c, why);
    }
  }
}

void Transport::watch(const ConnectionPtr& c) {
  peers_.add(c);
  poller_.add(c->fd(), reinterpret_cast<uint64_t>(c.get()), EPOLLIN | EPOLLRDHUP);
}

bool Transport::read_some(Connection& c, std::string& why) {
  try {
    if (!c.introduced()) {
      switch (c.handshake().read(c.fd(), identity_, why)) {
        case IncomingHandshake::Step::kWaiting:
          return true;
        case IncomingHandshake::Step::kEnded:
          return false;
        case IncomingHandshake::Step::kProved:
          break;
      }
      const auto keys = c.handshake().keys(identity_);
      c.introduce(keys, handshake::encrypts(identity_.address), pool_.get(), options_.max_message_bytes);
      acceptor_.forget(&c);
    }
    heartbeats_.heard_from(c.peer());  // bytes (or an end) from the peer: it is alive enough to send
    const FrameReader::Deliver deliver = [&](const wire::Header& header, c10::IValue value, std::exception_ptr error) {
      if (c.outgoing()) {
        PUSH_CHECK(wire::is_reply(header.type), kRpcOrigin, "malformed frame: a request (type ", header.type,
                   ") where only replies are expected");
        callbacks_.reply(c.peer(), header, std::move(value), std::move(error));
      } else {
        PUSH_CHECK(wire::is_request(header.type), kRpcOrigin, "malformed frame: a reply (type ", header.type,
                   ") where only requests are expected");
        callbacks_.request(c.shared_from_this(), c.peer(), header, std::move(value), std::move(error));
      }
    };
    return c.reader().read(c.fd(), deliver, why);
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

}  // namespace push::dist::detail
