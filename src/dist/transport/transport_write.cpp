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
#include "dist/transport/transport.h"

#include "dist/transport/connection.h"

#include <push/core/errors.h>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>
#include "core/event_loop.h"
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {
namespace {

using push::detail::waits_suspend_here;

/// The turn to write one whole frame on a connection. Waiting for it suspends a fiber;
/// a thread that cannot suspend waits on the connection's condition variable.
class WriteTurn {
 public:
  /// Takes the turn; `owed` receives what a heartbeat left unsent (it goes first).
  WriteTurn(const Transport& t, Connection& c, std::vector<char>& owed) : c_(c) {
    std::unique_lock<std::mutex> lock(c.send_mutex);
    for (;;) {
      PUSH_CHECK(!c.closed, kRpcOrigin, "the connection to ", t.describe(c.peer), " is closed");
      if (!c.writing) {
        c.writing = true;
        c.turn_loop = push::detail::EventLoop::current();
        owed.swap(c.owed);
        return;
      }
      if (waits_suspend_here()) {
        Promise<bool> freed;
        c.turn_waiters.push_back(freed);
        lock.unlock();
        freed.future().wait_ready();
        lock.lock();
      } else {
        // The holder is a fiber of this very thread's loop, suspended: blocking here would
        // keep it from ever finishing.
        const void* here = push::detail::EventLoop::current();
        PUSH_CHECK(here == nullptr || here != c.turn_loop, kRpcOrigin, "cannot send to ", t.describe(c.peer),
                   " from here: a handler of this same loop is writing to it and waits for it to read, and "
                   "this code cannot wait (an inline continuation, a backward pass, Particle::borrow); send "
                   "from a handler or from another thread");
        ++c.threads_waiting;
        c.turn_free.wait(lock);
        --c.threads_waiting;
      }
    }
  }
  ~WriteTurn() {
    std::vector<Promise<bool>> waiters;
    bool threads = false;
    {
      std::lock_guard<std::mutex> lock(c_.send_mutex);
      c_.writing = false;
      c_.turn_loop = nullptr;
      // close() left the descriptor to the writer it found writing.
      if (c_.closed && !c_.fd_closed) {
        ::close(c_.fd);
        c_.fd_closed = true;
      }
      // Every waiter looks again (one that gave up waiting must not swallow the wake).
      waiters.swap(c_.turn_waiters);
      threads = c_.threads_waiting > 0;
    }
    if (threads) c_.turn_free.notify_all();
    for (auto& w : waiters) w.set_value(true);
  }
  WriteTurn(const WriteTurn&) = delete;
  WriteTurn& operator=(const WriteTurn&) = delete;

 private:
  Connection& c_;
};

Clock::time_point send_deadline(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? Clock::deadline_after(timeout) : Clock::time_point::max();
}

}  // namespace

void Transport::write_frame(Connection& c, const wire::Header& header_in, const wire::Encoded& body) {
  wire::Header header = header_in;
  header.meta_bytes = static_cast<uint32_t>(body.meta.size());
  header.tensor_count = static_cast<uint32_t>(body.tensors.size());
  header.data_bytes = body.data_bytes;
  PUSH_CHECK(body.meta.size() <= options_.max_message_bytes &&
                 body.data_bytes <= options_.max_message_bytes - body.meta.size(),
             kRpcOrigin, "a message of ", body.meta.size() + body.data_bytes, " bytes is over the limit of ",
             options_.max_message_bytes, " bytes (RpcGroupOptions::max_message_bytes)");
  std::vector<char> owed;  // what a heartbeat left unsent: it goes first, so the stream stays whole
  WriteTurn turn(*this, c, owed);
  try {
    write_in_turn(c, header, body, owed);
  } catch (...) {
    // Part of the frame may be on the stream: end it, so the reader side closes it too
    // rather than read the next frame as this one's bytes.
    ::shutdown(c.fd, SHUT_RDWR);
    throw;
  }
}

void Transport::write_in_turn(Connection& c, wire::Header header, const wire::Encoded& body, std::vector<char>& owed) {
  if (!owed.empty()) {
    iovec iov{owed.data(), owed.size()};
    send_all(c, &iov, 1);
  }
  SendRing* ring = body.data_bytes >= options_.ring_min_bytes ? ring_for(c) : nullptr;
  if (ring != nullptr) header.flags |= wire::kRingData;
  FrameSeal& seal = *c.send_seal;
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
    stream_through(c, *ring, body);
    return;
  }
  if (seal.encrypts()) {
    send_encrypted(c, std::move(head), body);
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

void Transport::send_encrypted(Connection& c, std::vector<char> out, const wire::Encoded& body) {
  FrameSeal& seal = *c.send_seal;
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

void Transport::send_all(Connection& c, iovec* iov, std::size_t count) {
  auto deadline = send_deadline(options_.send_timeout);
  std::size_t first = 0;
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = std::min<std::size_t>(count - first, IOV_MAX);
    const ssize_t n = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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

void Transport::give_up(Connection& c, const std::string& why) {
  // write_frame ends the stream (half a frame may be in it) as for any failure midway.
  throw Error(c10::str("[", kRpcOrigin, "] cannot send to ", describe(c.peer), ": ", why));
}

void Transport::wait_writable(Connection& c, Clock::time_point deadline) {
  if (Clock::now() >= deadline) give_up(c, "no progress within the send timeout");
  if (!waits_suspend_here()) {
    pollfd p{c.fd, POLLOUT, 0};
    ::poll(&p, 1, poll_timeout_ms(deadline, 100));
    return;  // the caller sends again: a closed connection fails it
  }
  Promise<bool> ready;
  {
    std::lock_guard<std::mutex> lock(c.send_mutex);
    if (c.closed) return;
    c.writable = ready;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
    ev.data.ptr = &c;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }
  // At most 100 ms, then the caller tries again whether or not the I/O thread said so:
  // the I/O thread may itself be waiting for this connection's turn (a continuation that
  // sends), and then cannot deliver EPOLLOUT.
  const auto slice = std::min<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(100));
  ready.future().wait_for(std::max(slice, Clock::duration::zero()));
}

void Transport::on_writable(Connection& c) {
  std::optional<Promise<bool>> ready;
  {
    std::lock_guard<std::mutex> lock(c.send_mutex);
    ready.swap(c.writable);
    if (!c.closed) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.ptr = &c;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    }
  }
  if (ready) ready->set_value(true);
}

SendRing* Transport::ring_for(Connection& c) {
  if (c.send_ring) return c.send_ring.get();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (c.ring_refused || c.peer < 0 || same_host_[c.peer] == 0) return nullptr;
  }
  std::string why;
  auto ring = SendRing::create(options_.ring_slot_bytes, options_.ring_slots, why);
  if (!ring) {
    c.ring_refused = true;
    std::cerr << "[push::dist::RpcGroup] " << options_.names.at(options_.rank) << ": no shared memory for "
              << describe(c.peer) << " (" << why << "): large messages go through the socket\n";
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
  std::vector<char> frame = seal_head(*c.send_seal, head, sizeof(head), announce.meta);
  iovec iov{frame.data(), frame.size()};
  send_all(c, &iov, 1);
  c.send_ring = std::move(ring);
  c.ring_to_wake = c.send_ring.get();
  return c.send_ring.get();
}

char* Transport::next_slot(Connection& c, SendRing& ring) {
  const auto deadline = send_deadline(options_.send_timeout);
  const std::string peer = describe(c.peer);
  if (!waits_suspend_here()) return ring.acquire(deadline, c.broken, peer);
  // A fiber waits for the receiver at most a millisecond at a time on its thread, and
  // sleeps (suspended) in between, longer each time up to 16 ms.
  auto nap = std::chrono::milliseconds(1);
  for (;;) {
    if (char* slot =
            ring.try_acquire(std::min(deadline, Clock::deadline_after(std::chrono::milliseconds(1))), c.broken, peer)) {
      return slot;
    }
    if (Clock::now() >= deadline) return ring.acquire(deadline, c.broken, peer);  // throws, naming why
    Promise<bool> never;
    never.future().wait_for(nap);
    nap = std::min(nap * 2, std::chrono::milliseconds(16));
  }
}

void Transport::stream_through(Connection& c, SendRing& ring, const wire::Encoded& body) {
  FrameSeal& seal = *c.send_seal;
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
