#include "dist/transport/sender.h"

#include <push/core/errors.h>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>

#include "core/event_loop.h"
#include "dist/transport/connection.h"
#include "dist/transport/peer_table.h"
#include "dist/transport/poller.h"
#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"
#include "dist/transport/transport.h"

namespace push::dist::detail {
namespace {

using push::detail::waits_suspend_here;

Clock::time_point send_deadline(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? Clock::deadline_after(timeout) : Clock::time_point::max();
}

uint64_t tag_of(Connection& c) { return reinterpret_cast<uint64_t>(&c); }

}  // namespace

void Sender::write_frame(Connection& c, const wire::Header& header_in, const wire::Encoded& body) const {
  wire::Header header = header_in;
  header.meta_bytes = static_cast<uint32_t>(body.meta.size());
  header.tensor_count = static_cast<uint32_t>(body.tensors.size());
  header.data_bytes = body.data_bytes;
  PUSH_CHECK(body.meta.size() <= options_.max_message_bytes &&
                 body.data_bytes <= options_.max_message_bytes - body.meta.size(),
             kRpcOrigin, "a message of ", body.meta.size() + body.data_bytes, " bytes is over the limit of ",
             options_.max_message_bytes, " bytes (RpcGroupOptions::max_message_bytes)");
  WriteSide::Turn turn(c.writer(), [&] { return options_.describe(c.peer()); });  // named only on failure
  try {
    write_in_turn(c, turn, header, body);
  } catch (...) {
    // Part of the frame may be on the stream: end it, so the reader side closes it too
    // rather than read the next frame as this one's bytes.
    ::shutdown(c.fd(), SHUT_RDWR);
    throw;
  }
}

void Sender::write_in_turn(Connection& c, WriteSide::Turn& turn, wire::Header header, const wire::Encoded& body) const {
  if (!turn.owed().empty()) {  // a heartbeat's tail: it goes first, so the stream stays whole
    iovec iov{turn.owed().data(), turn.owed().size()};
    send_all(c, &iov, 1);
  }
  SendRing* ring = body.data_bytes >= options_.ring_min_bytes ? ring_for(c, turn) : nullptr;
  if (ring != nullptr) header.flags |= wire::kRingData;
  FrameSeal& seal = turn.seal();
  char head_bytes[wire::kHeaderBytes];
  wire::write_header(header, head_bytes);
  std::vector<char> head = seal_head(seal, head_bytes, sizeof(head_bytes), body.meta);
  if (body.data_bytes == 0) {
    iovec iov{head.data(), head.size()};
    send_all(c, &iov, 1);
    return;
  }
  if (ring != nullptr) {
    iovec iov{head.data(), head.size()};
    send_all(c, &iov, 1);
    stream_through(c, turn, *ring, body);
    return;
  }
  if (seal.encrypts()) {
    send_encrypted(c, seal, std::move(head), body);
    return;
  }
  // Within the host: the tensors go straight from their storage, authenticated first.
  seal.begin();
  std::vector<iovec> iov;
  iov.reserve(2 + body.tensors.size());
  iov.push_back({head.data(), head.size()});
  for (const auto& t : body.tensors) {
    if (t.nbytes() == 0) continue;
    seal.authenticate(t.data_ptr(), t.nbytes());
    iov.push_back({t.data_ptr(), t.nbytes()});
  }
  Tag tag = seal.seal();
  iov.push_back({tag.data(), tag.size()});
  send_all(c, iov.data(), iov.size());
}

void Sender::send_encrypted(Connection& c, FrameSeal& seal, std::vector<char> out, const wire::Encoded& body) const {
  seal.begin();
  // The head, then the ciphertext, kStagingBytes at a time through one buffer.
  for (const auto& t : body.tensors) {
    const auto* from = static_cast<const char*>(t.data_ptr());
    for (uint64_t done = 0; done < t.nbytes();) {
      if (out.size() >= kStagingBytes) {
        iovec iov{out.data(), out.size()};
        send_all(c, &iov, 1);
        out.clear();
      }
      const uint64_t take = std::min<uint64_t>(t.nbytes() - done, kStagingBytes - out.size());
      const std::size_t at = out.size();
      out.resize(at + take);
      seal.crypt(from + done, out.data() + at, take);
      done += take;
    }
  }
  const Tag tag = seal.seal();
  out.insert(out.end(), tag.begin(), tag.end());
  iovec iov{out.data(), out.size()};
  send_all(c, &iov, 1);
}

void Sender::send_all(Connection& c, iovec* iov, std::size_t count) const {
  auto deadline = send_deadline(options_.send_timeout);
  std::size_t first = 0;
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = std::min<std::size_t>(count - first, IOV_MAX);
    const ssize_t n = ::sendmsg(c.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_writable(c, deadline);
        continue;
      }
      give_up(c, std::strerror(errno));
    }
    deadline = send_deadline(options_.send_timeout);  // progress
    auto left = static_cast<std::size_t>(n);
    while (first < count && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void Sender::give_up(const Connection& c, const std::string& why) const {
  // write_frame ends the stream (half a frame may be in it) as for any failure midway.
  throw Error(c10::str("[", kRpcOrigin, "] cannot send to ", options_.describe(c.peer()), ": ", why));
}

void Sender::wait_writable(Connection& c, Clock::time_point deadline) const {
  if (Clock::now() >= deadline) give_up(c, "no progress within the send timeout");
  if (!waits_suspend_here()) {
    pollfd p{c.fd(), POLLOUT, 0};
    ::poll(&p, 1, poll_timeout_ms(deadline, 100));
    return;  // the caller sends again: a closed connection fails it
  }
  Promise<bool> ready;
  const bool waiting =
      c.writer().await_writable(ready, [&] { poller_.modify(c.fd(), tag_of(c), EPOLLIN | EPOLLRDHUP | EPOLLOUT); });
  if (!waiting) return;
  // At most 100 ms, then the caller tries again whether or not the I/O thread said so:
  // the I/O thread may itself be waiting for this connection's turn (a continuation that
  // sends), and then cannot deliver EPOLLOUT.
  const auto slice = std::min<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(100));
  ready.future().wait_for(std::max(slice, Clock::duration::zero()));
}

void Sender::on_writable(Connection& c) const {
  c.writer().writable_again([&] { poller_.modify(c.fd(), tag_of(c), EPOLLIN | EPOLLRDHUP); });
}

SendRing* Sender::ring_for(Connection& c, WriteSide::Turn& turn) const {
  if (turn.ring() != nullptr) return turn.ring();
  if (turn.ring_refused() || !peers_.rings(c.peer())) return nullptr;
  std::string why;
  auto ring = SendRing::create(options_.ring_slot_bytes, options_.ring_slots, why);
  if (!ring) {
    turn.refuse_ring();
    std::cerr << "[push::dist::RpcGroup] " << options_.self() << ": no shared memory for "
              << options_.describe(c.peer()) << " (" << why << "): large messages go through the socket\n";
    return nullptr;
  }
  wire::Header h;
  h.type = wire::kRing;
  wire::Encoded announce;
  for (uint64_t v : {static_cast<uint64_t>(::getpid()), static_cast<uint64_t>(ring->fd()), ring->slot_bytes(),
                     static_cast<uint64_t>(ring->slots())}) {
    const auto* p = reinterpret_cast<const char*>(&v);
    announce.meta.insert(announce.meta.end(), p, p + sizeof(v));
  }
  h.meta_bytes = static_cast<uint32_t>(announce.meta.size());
  char head[wire::kHeaderBytes];
  wire::write_header(h, head);
  std::vector<char> frame = seal_head(turn.seal(), head, sizeof(head), announce.meta);
  iovec iov{frame.data(), frame.size()};
  send_all(c, &iov, 1);
  turn.keep_ring(std::move(ring));
  return turn.ring();
}

char* Sender::next_slot(Connection& c, SendRing& ring) const {
  const auto deadline = send_deadline(options_.send_timeout);
  const std::string peer = options_.describe(c.peer());
  const auto& broken = c.writer().broken();
  if (!waits_suspend_here()) return ring.acquire(deadline, broken, peer);
  // A fiber waits for the receiver at most a millisecond at a time on its thread, and
  // sleeps (suspended) in between, longer each time up to 16 ms.
  auto nap = std::chrono::milliseconds(1);
  for (;;) {
    if (char* slot =
            ring.try_acquire(std::min(deadline, Clock::deadline_after(std::chrono::milliseconds(1))), broken, peer)) {
      return slot;
    }
    if (Clock::now() >= deadline) return ring.acquire(deadline, broken, peer);  // throws, naming why
    Promise<bool> never;
    never.future().wait_for(nap);
    nap = std::min(nap * 2, std::chrono::milliseconds(16));
  }
}

void Sender::stream_through(Connection& c, WriteSide::Turn& turn, SendRing& ring, const wire::Encoded& body) const {
  FrameSeal& seal = turn.seal();
  seal.begin();  // the notes are the data segment; the bytes in the ring are not sealed
  std::size_t index = 0;
  uint64_t offset = 0;  // into body.tensors[index]
  uint64_t left = body.data_bytes;
  while (left > 0) {
    char* slot = next_slot(c, ring);
    uint64_t note = std::min(left, ring.slot_bytes());
    for (uint64_t filled = 0; filled < note;) {
      const auto& t = body.tensors[index];
      const uint64_t take = std::min<uint64_t>(note - filled, t.nbytes() - offset);
      // An empty tensor has no storage to copy from (memcpy from null is undefined).
      if (take > 0) std::memcpy(slot + filled, static_cast<const char*>(t.data_ptr()) + offset, take);
      filled += take;
      offset += take;
      if (offset == t.nbytes()) {
        ++index;
        offset = 0;
      }
    }
    ring.publish();
    left -= note;
    char sealed[sizeof(note) + kTagBytes];
    seal.crypt(&note, sealed, sizeof(note));
    std::size_t bytes = sizeof(note);
    if (left == 0) {  // the tag goes with the last note
      const Tag tag = seal.seal();
      std::memcpy(sealed + bytes, tag.data(), kTagBytes);
      bytes += kTagBytes;
    }
    iovec iov{sealed, bytes};
    send_all(c, &iov, 1);
  }
}

}  // namespace push::dist::detail
