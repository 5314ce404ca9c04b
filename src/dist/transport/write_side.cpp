#include "dist/transport/write_side.h"

#include <push/core/errors.h>

#include <sys/socket.h>
#include <unistd.h>

#include "core/event_loop.h"
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {

using push::detail::EventLoop;
using push::detail::waits_suspend_here;

WriteSide::Turn::Turn(WriteSide& side, const std::function<std::string()>& peer) : side_(side) {
  std::unique_lock<std::mutex> lock(side.mutex_);
  for (;;) {
    PUSH_CHECK(!side.closed_, kRpcOrigin, "the connection to ", peer(), " is closed");
    if (!side.writing_) {
      side.writing_ = true;
      side.turn_loop_ = EventLoop::current();
      owed_.swap(side.owed_);
      return;
    }
    if (waits_suspend_here()) {
      Promise<bool> freed;
      side.turn_waiters_.push_back(freed);
      lock.unlock();
      freed.future().wait_ready();
      lock.lock();
    } else {
      // The holder is a fiber of this very thread's loop, suspended: blocking here would
      // keep it from ever finishing.
      const void* here = EventLoop::current();
      PUSH_CHECK(here == nullptr || here != side.turn_loop_, kRpcOrigin, "cannot send to ", peer(),
                 " from here: a handler of this same loop is writing to it and waits for it to read, and "
                 "this code cannot wait (an inline continuation, a backward pass, Particle::borrow); send "
                 "from a handler or from another thread");
      ++side.threads_waiting_;
      side.turn_free_.wait(lock);
      --side.threads_waiting_;
    }
  }
}

WriteSide::Turn::~Turn() {
  std::vector<Promise<bool>> waiters;
  bool threads = false;
  {
    std::lock_guard<std::mutex> lock(side_.mutex_);
    side_.writing_ = false;
    side_.turn_loop_ = nullptr;
    // close() left the descriptor to the writer it found writing.
    if (side_.closed_ && !side_.fd_closed_) {
      ::close(side_.fd_);
      side_.fd_closed_ = true;
    }
    // Every waiter looks again (one that gave up waiting must not swallow the wake).
    waiters.swap(side_.turn_waiters_);
    threads = side_.threads_waiting_ > 0;
  }
  if (threads) side_.turn_free_.notify_all();
  for (auto& w : waiters) w.set_value(true);
}

void WriteSide::Turn::keep_ring(std::unique_ptr<SendRing> ring) {
  side_.ring_ = std::move(ring);
  side_.ring_to_wake_ = side_.ring_.get();
}

void WriteSide::close() {
  broken_ = true;  // a sender waiting for its ring
  if (SendRing* ring = ring_to_wake_.load()) ring->interrupt();
  std::vector<Promise<bool>> wake;  // senders waiting for the turn or for the socket
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      closed_ = true;
      // A sender writing now still uses the descriptor: it closes it when it is done.
      if (!writing_) {
        ::close(fd_);
        fd_closed_ = true;
      }
    }
    wake.swap(turn_waiters_);
    if (writable_) wake.push_back(*writable_);
    writable_.reset();
  }
  turn_free_.notify_all();
  for (auto& w : wake) w.set_value(true);
}

bool WriteSide::await_writable(Promise<bool> ready, const std::function<void()>& watch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return false;
  writable_ = std::move(ready);
  watch();
  return true;
}

void WriteSide::writable_again(const std::function<void()>& unwatch) {
  std::optional<Promise<bool>> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready.swap(writable_);
    if (!closed_) unwatch();
  }
  if (ready) ready->set_value(true);
}

void WriteSide::beat(const char* header, std::size_t bytes) {
  // A sender holding the connection is writing to the peer already; never wait for it.
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || closed_ || writing_) return;
  // This round's heartbeat, or what is left of the last one: what the socket does not take
  // now stays owed, and the next sender writes it first, so that the stream (and the count
  // of sealed segments) stays whole.
  if (owed_.empty()) owed_ = seal_head(*seal_, header, bytes, {});
  const ssize_t n = ::send(fd_, owed_.data(), owed_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n > 0) owed_.erase(owed_.begin(), owed_.begin() + n);
}

}  // namespace push::dist::detail
