#pragma once
// Shared-memory rings that carry large tensor bytes between two members on one host.
//
// Over loopback TCP a byte is copied twice by the kernel and moves at about a fifth of
// memcpy's speed; through shared memory it is copied once by the sender (into a slot) and
// once by the receiver (out of it), and the two copies overlap slot by slot. The socket
// still carries every frame's header and meta, and one 8-byte note per filled slot, which
// is what wakes the receiver's I/O thread; so frames stay in order and a dead peer is
// still seen as a closed connection.
//
// The sender of a connection direction owns its ring: an anonymous memfd (sealed against
// resizing, named "push-rpc-ring") of `slots` slots of `slot_bytes` behind one header
// page. It announces it once, in a kRing frame (its pid and the fd number); the receiver
// opens it through /proc/<pid>/fd/<fd>, which works between processes of one user in one
// PID namespace, and checks that it is a sealed push ring of the announced size before it
// maps it. Nothing is named in /dev/shm, so a killed process leaks nothing. The receiver
// counts the slots it has emptied in the header; a sender that finds every slot full
// waits on that counter with a futex (shared between the processes).
#include <push/core/errors.h>

#include "core/clock.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace push::dist::detail {

/// The sender's side.
class SendRing {
 public:
  /// A new ring, or null when this process cannot make one (`why` says why).
  static std::unique_ptr<SendRing> create(uint64_t slot_bytes, uint32_t slots, std::string& why);
  ~SendRing();
  SendRing(const SendRing&) = delete;
  SendRing& operator=(const SendRing&) = delete;

  int fd() const { return fd_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }

  /// The next slot to fill, once the receiver has emptied it. Throws push::Error when
  /// `deadline` passes first or `broken` becomes true (see interrupt()).
  char* acquire(push::detail::Clock::time_point deadline, const std::atomic<bool>& broken, const std::string& peer);
  /// Like acquire(), but null when `until` passes first (a sender that must not block its
  /// thread for long waits elsewhere and tries again). Throws when `broken` becomes true.
  char* try_acquire(push::detail::Clock::time_point until, const std::atomic<bool>& broken, const std::string& peer);
  /// The slot acquire() returned is full: the receiver may read it.
  void publish() { ++head_; }
  /// Wakes a sender waiting in acquire(), so that it sees `broken`.
  void interrupt();

 private:
  SendRing() = default;
  int fd_ = -1;
  char* base_ = nullptr;
  std::size_t mapped_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t slots_ = 0;
  uint32_t head_ = 0;  // slots filled so far (mod 2^32)
};

/// The receiver's side.
class RecvRing {
 public:
  /// Maps the ring that process `pid` announced as its descriptor `fd`. Throws push::Error
  /// naming what is wrong (cannot open, not a push ring, wrong size).
  static std::unique_ptr<RecvRing> open(int64_t pid, int64_t fd, uint64_t slot_bytes, uint32_t slots);
  ~RecvRing();
  RecvRing(const RecvRing&) = delete;
  RecvRing& operator=(const RecvRing&) = delete;

  uint64_t slot_bytes() const { return slot_bytes_; }
  /// The slot to empty next.
  const char* front() const;
  /// That slot is empty again: the sender may refill it.
  void pop();

 private:
  RecvRing() = default;
  char* base_ = nullptr;
  std::size_t mapped_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t slots_ = 0;
  uint32_t tail_ = 0;
};

/// What two processes must share for rings between them: the machine (boot id), the PID
/// namespace and the user for the rings to work, and the network namespace because
/// processes in two of them are two hosts to the job (containers, the test bed of
/// tests/netbed): what they send each other crosses the network their addresses name.
std::string host_identity();

}  // namespace push::dist::detail
