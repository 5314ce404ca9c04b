#include "dist/transport/connection.h"
#include "dist/transport/transport.h"

#include <push/core/errors.h>

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include "dist/transport/rpc_origin.h"

// The transport's I/O thread: waits on every connection with epoll, assembles frames,
// maps announced rings and empties their slots, and hands complete messages on.
namespace push::dist::detail {
namespace {

enum class Received { kBytes, kNothingYet, kEnd };

/// One non-blocking read of at most `max` bytes into `into`: kBytes (`n` > 0), kNothingYet,
/// or kEnd when the connection ended or failed (`why` says how).
Received receive(int fd, char* into, std::size_t max, ssize_t& n, std::string& why) {
  for (;;) {
    n = ::recv(fd, into, max, MSG_DONTWAIT);
    if (n > 0) return Received::kBytes;
    if (n == 0) {
      why = "the peer closed the connection";
      return Received::kEnd;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Received::kNothingYet;
    why = std::strerror(errno);
    return Received::kEnd;
  }
}

}  // namespace

void Transport::loop() {
  epoll_event events[64];
  while (!stopping_) {
    // Asleep at most until the nearest call deadline (and 1 s at most, so that stopping_ is
    // seen; 1 ms with a ManualClock, so that a deadline the test moves past is seen).
    // Awake, any new deadline wakes it (it may have read the deadlines before it came);
    // asleep, only one before it plans to look again (wake_by).
    sleeps_until_.store(std::numeric_limits<int64_t>::max());
    closed_in_batch_.clear();
    auto next = callbacks_.tick();
    for (const auto& wake : {expire_handshakes(), keep_alive()}) {
      if (wake && (!next || *wake < *next)) next = wake;
    }
    const int timeout_ms = next ? poll_timeout_ms(*next, 1000) : 1000;
    sleeps_until_.store((Clock::now() + std::chrono::milliseconds(timeout_ms)).time_since_epoch().count());
    const int n = ::epoll_wait(epoll_fd_, events, 64, timeout_ms);
    for (int i = 0; i < n && !stopping_; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t count;
        [[maybe_unused]] auto r = ::read(wake_fd_, &count, sizeof(count));
      } else if (tag == kListenTag) {
        accept_all();
      } else {
        auto* c = static_cast<Connection*>(events[i].data.ptr);
        if (c->gone) continue;  // closed earlier in this batch (kept alive until it ends)
        if ((events[i].events & EPOLLOUT) != 0) on_writable(*c);
        if ((events[i].events & ~static_cast<uint32_t>(EPOLLOUT)) == 0) continue;
        std::string why;
        if (!read_some(*c, why)) close(c, why);
      }
    }
  }
}

bool Transport::read_handshake(Connection& c, std::string& why) {
  namespace hs = handshake;
  // The hello and the proof have the same size: a header, checked as soon as it is in, and
  // 32 bytes. Nothing past them is read here.
  for (;;) {
    const std::size_t want = c.handshake_got < wire::kHeaderBytes ? wire::kHeaderBytes : hs::kHelloBytes;
    ssize_t n = 0;
    const auto got = receive(c.fd, c.handshake_in + c.handshake_got, want - c.handshake_got, n, why);
    if (got != Received::kBytes) return got == Received::kNothingYet;
    c.handshake_got += static_cast<std::size_t>(n);
    const bool hello = c.handshake == Connection::Handshake::kHello;
    if (c.handshake_got == wire::kHeaderBytes) {
      const wire::Header h = hs::check_header(c.handshake_in, hello, options_.size);
      if (hello) c.peer = static_cast<int>(h.id);
    }
    if (c.handshake_got < hs::kHelloBytes) continue;
    c.handshake_got = 0;
    if (hello) {
      std::memcpy(c.dialer_nonce.data(), c.handshake_in + wire::kHeaderBytes, hs::kBytes);
      c.listener_nonce = hs::random_bytes();
      const auto challenge = hs::challenge_frame(
          options_.rank, c.listener_nonce,
          hs::proof(options_.key, "listener", c.dialer_nonce, c.listener_nonce, c.peer, options_.rank, address_));
      // A fresh connection's send buffer takes these few bytes at once; the I/O thread
      // never waits on a peer.
      const ssize_t sent = ::send(c.fd, challenge.data(), challenge.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      PUSH_CHECK(sent == static_cast<ssize_t>(challenge.size()), kRpcOrigin, "cannot send the challenge");
      c.handshake = Connection::Handshake::kProof;
      continue;
    }
    hs::Bytes theirs;
    std::memcpy(theirs.data(), c.handshake_in + wire::kHeaderBytes, hs::kBytes);
    PUSH_CHECK(hs::same(theirs, hs::proof(options_.key, "dialer", c.dialer_nonce, c.listener_nonce, c.peer,
                                          options_.rank, address_)),
               kRpcOrigin, "a wrong proof for group rank ", c.peer,
               " (not this job's key, or it dialed another address: a relay)");
    c.introduced = true;
    c.seal_with(hs::session_keys(options_.key, c.dialer_nonce, c.listener_nonce, c.peer, options_.rank, address_),
                hs::encrypts(address_));
    forget_pending(&c);
    c.staging.resize(kStagingBytes);
    return true;
  }
}

bool Transport::read_some(Connection& c, std::string& why) {
  using Stage = Connection::Stage;
  try {
    if (!c.introduced) {
      if (!read_handshake(c, why)) return false;
      if (!c.introduced) return true;
    }
    heard_from(c.peer);  // bytes (or an end) from the peer: it is alive enough to send
    FrameSeal& seal = *c.recv_seal;
    for (int turn = 0; turn < 64; ++turn) {
      if (c.begin == c.end) {
        // Large tensor bytes go straight into their tensor, past the staging buffer, and are
        // opened there.
        if (c.stage == Stage::kData && c.skip == 0 && !c.ring_data()) {
          auto [dst, need] = c.tensor_window();
          if (dst != nullptr && need >= kStagingBytes) {
            ssize_t n = 0;
            const auto got = receive(c.fd, dst, need, n, why);
            if (got != Received::kBytes) return got == Received::kNothingYet;
            seal.crypt(dst, dst, static_cast<std::size_t>(n));
            c.tensor_got += static_cast<uint64_t>(n);
            if (c.data_complete()) c.stage = Stage::kDataTag;
            continue;
          }
        }
        ssize_t n = 0;
        const auto got = receive(c.fd, c.staging.data(), c.staging.size(), n, why);
        if (got != Received::kBytes) return got == Received::kNothingYet;
        c.begin = 0;
        c.end = static_cast<std::size_t>(n);
      }
      while (c.begin < c.end) {
        const std::size_t avail = c.end - c.begin;
        char* src = c.staging.data() + c.begin;
        if (c.stage == Stage::kHeader) {
          const auto take = std::min(avail, wire::kHeaderBytes - c.header_got);
          std::memcpy(c.header_bytes + c.header_got, src, take);
          c.header_got += take;
          c.begin += take;
          if (c.header_got < wire::kHeaderBytes) continue;
          c.header_got = 0;
          c.header = wire::read_header(c.header_bytes, options_.max_message_bytes);
          PUSH_CHECK(!wire::is_handshake(c.header.type), kRpcOrigin, "malformed frame: a handshake frame (type ",
                     c.header.type, ") after the handshake");
          PUSH_CHECK(!c.ring_data() || c.recv_ring, kRpcOrigin,
                     "malformed frame: data in a shared-memory ring that was never announced");
          PUSH_CHECK(c.header.type != wire::kHeartbeat || (c.header.meta_bytes == 0 && c.header.data_bytes == 0),
                     kRpcOrigin, "malformed frame: a heartbeat with a body");
          seal.begin();
          seal.authenticate(c.header_bytes, wire::kHeaderBytes);
          // The meta grows as its bytes arrive: a header alone costs nothing.
          c.meta.clear();
          c.meta.reserve(std::min<std::size_t>(c.header.meta_bytes, kStagingBytes));
          c.stage = Stage::kMeta;
        } else if (c.stage == Stage::kMeta) {
          const auto take = std::min<std::size_t>(avail, c.header.meta_bytes - c.meta.size());
          const std::size_t at = c.meta.size();
          c.meta.resize(at + take);
          seal.crypt(src, c.meta.data() + at, take);
          c.begin += take;
        } else if (c.stage == Stage::kHeadTag || c.stage == Stage::kDataTag) {
          const auto take = std::min(avail, kTagBytes - c.tag_got);
          std::memcpy(c.tag + c.tag_got, src, take);
          c.tag_got += take;
          c.begin += take;
          if (c.tag_got < kTagBytes) continue;
          c.tag_got = 0;
          PUSH_CHECK(seal.open(c.tag), kRpcOrigin,
                     "a frame failed authentication (changed on the way, replayed, or not sent by the member that "
                     "proved itself)");
          if (c.stage == Stage::kHeadTag) {
            head_opened(c);
          } else {
            deliver(c);
          }
        } else if (c.ring_data()) {
          const auto take = std::min(avail, sizeof(c.note) - c.note_got);
          std::memcpy(c.note + c.note_got, src, take);
          c.note_got += take;
          c.begin += take;
          if (c.note_got == sizeof(c.note)) {
            c.note_got = 0;
            seal.crypt(c.note, c.note, sizeof(c.note));
            uint64_t bytes;
            std::memcpy(&bytes, c.note, sizeof(bytes));
            take_slot(c, bytes);
          }
        } else if (c.skip > 0) {
          const auto take = std::min<uint64_t>(avail, c.skip);
          seal.crypt(src, src, take);  // opened only for the tag
          c.skip -= take;
          c.begin += take;
        } else {
          auto [dst, need] = c.tensor_window();
          const auto take = std::min<uint64_t>(avail, need);
          seal.crypt(src, dst, take);
          c.tensor_got += take;
          c.begin += take;
        }
        if (c.stage == Stage::kMeta && c.meta.size() == c.header.meta_bytes) c.stage = Stage::kHeadTag;
        if (c.stage == Stage::kData && c.data_complete()) c.stage = Stage::kDataTag;
      }
    }
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

void Transport::head_opened(Connection& c) {
  c.stage = Connection::Stage::kHeader;
  if (c.header.type == wire::kHeartbeat) return;
  if (c.header.type == wire::kRing) {
    open_ring(c);
    return;
  }
  c.tensors.clear();
  c.table_error = nullptr;
  try {
    c.tensors = wire::read_tensor_table(c.meta, c.header, pool_.get());
  } catch (const std::exception&) {
    c.table_error = std::current_exception();
    if (!c.ring_data()) c.skip = c.header.data_bytes;
  }
  c.tensor_index = 0;
  c.tensor_got = 0;
  c.ring_left = c.ring_data() ? c.header.data_bytes : 0;
  c.note_got = 0;
  if (c.header.data_bytes == 0) {
    deliver(c);
    return;
  }
  c.recv_seal->begin();
  c.stage = Connection::Stage::kData;
}

void Transport::open_ring(Connection& c) {
  PUSH_CHECK(!c.recv_ring, kRpcOrigin, "malformed frame: a second shared-memory ring");
  PUSH_CHECK(c.header.meta_bytes == 32 && c.header.data_bytes == 0 && c.header.tensor_count == 0, kRpcOrigin,
             "malformed frame: a ring announcement of ", c.header.meta_bytes, " bytes");
  uint64_t v[4];
  std::memcpy(v, c.meta.data(), sizeof(v));
  const uint64_t slot_bytes = v[2], slots = v[3];
  PUSH_CHECK(slot_bytes >= 4096 && slot_bytes <= (uint64_t{1} << 30) && slots >= 1 && slots <= 4096, kRpcOrigin,
             "malformed frame: a ring of ", slots, " slots of ", slot_bytes, " bytes");
  c.recv_ring = RecvRing::open(static_cast<int64_t>(std::min<uint64_t>(v[0], INT64_MAX)),
                               static_cast<int64_t>(std::min<uint64_t>(v[1], INT64_MAX)), slot_bytes,
                               static_cast<uint32_t>(slots));
}

void Transport::take_slot(Connection& c, uint64_t bytes) {
  PUSH_CHECK(bytes == std::min(c.ring_left, c.recv_ring->slot_bytes()), kRpcOrigin, "malformed frame: a note of ",
             bytes, " bytes where ", std::min(c.ring_left, c.recv_ring->slot_bytes()), " were due");
  const char* src = c.recv_ring->front();
  if (!c.table_error) {
    for (uint64_t done = 0; done < bytes;) {
      auto [dst, need] = c.tensor_window();
      PUSH_CHECK(dst != nullptr, kRpcOrigin, "malformed frame: more ring data than its tensors hold");
      const uint64_t take = std::min(need, bytes - done);
      std::memcpy(dst, src + done, take);
      c.tensor_got += take;
      done += take;
    }
  }
  c.recv_ring->pop();
  c.ring_left -= bytes;
}

void Transport::deliver(Connection& c) {
  c.stage = Connection::Stage::kHeader;
  const wire::Header header = c.header;
  c10::IValue value;
  std::exception_ptr error = c.table_error;
  if (!error) {
    try {
      value = wire::decode(c.meta, c.tensors);
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  c.tensors.clear();
  c.table_error = nullptr;
  if (c.outgoing) {
    PUSH_CHECK(wire::is_reply(header.type), kRpcOrigin, "malformed frame: a request (type ", header.type,
               ") where only replies are expected");
    callbacks_.reply(c.peer, header, std::move(value), std::move(error));
  } else {
    PUSH_CHECK(wire::is_request(header.type), kRpcOrigin, "malformed frame: a reply (type ", header.type,
               ") where only requests are expected");
    callbacks_.request(c.shared_from_this(), c.peer, header, std::move(value), std::move(error));
  }
}

}  // namespace push::dist::detail
