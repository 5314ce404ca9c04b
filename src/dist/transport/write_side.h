#pragma once
// The sending side of one connection: what its senders share, with the lock that guards it.
//
// Senders take turns: one writes a whole frame while the others wait for the turn (a fiber
// suspends; a thread that cannot suspend waits on a condition variable). Whoever has the
// turn alone uses the connection's send seal and its shared-memory ring, reached only
// through its Turn. A writer whose peer does not take its bytes waits without holding the
// lock (await_writable), so that the I/O thread and other senders go on. A heartbeat is
// written between turns, never in one, and what the socket did not take of it is owed: the
// next turn writes it first, so that the stream stays whole.
#include <push/core/future.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dist/transport/frame_seal.h"
#include "dist/transport/shm_ring.h"

namespace push::dist::detail {

class WriteSide {
 public:
  explicit WriteSide(int fd) : fd_(fd) {}
  WriteSide(const WriteSide&) = delete;
  WriteSide& operator=(const WriteSide&) = delete;

  /// The turn to write one whole frame, held while it lives.
  class Turn {
   public:
    /// Waits for the turn. Throws push::Error, naming `peer()`, when the connection is
    /// closed, or when this thread cannot wait for a turn that a fiber of its own loop holds.
    Turn(WriteSide& side, const std::function<std::string()>& peer);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

    FrameSeal& seal() { return *side_.seal_; }
    /// What a heartbeat left unsent: written first.
    std::vector<char>& owed() { return owed_; }
    /// The connection's ring for what it sends (null until made); whether none can be made.
    SendRing* ring() { return side_.ring_.get(); }
    void keep_ring(std::unique_ptr<SendRing> ring);
    bool ring_refused() const { return side_.ring_refused_; }
    void refuse_ring() { side_.ring_refused_ = true; }

   private:
    WriteSide& side_;
    std::vector<char> owed_;
  };

  /// Seals what is sent from now on; called once, before any sender.
  void seal_with(std::unique_ptr<FrameSeal> seal) { seal_ = std::move(seal); }
  /// Nothing more is sent: the descriptor is closed now, or by the sender that has the turn
  /// when it ends; every waiting sender wakes (and fails).
  void close();
  /// Whether close() began: a sender waiting on the ring gives up.
  const std::atomic<bool>& broken() const { return broken_; }
  /// In a turn, the socket full: `ready` completes when the I/O thread sees it writable
  /// again (writable_again). `watch` asks it to look, under the lock. False when closed.
  bool await_writable(Promise<bool> ready, const std::function<void()>& watch);
  /// The I/O thread: the socket is writable again; `unwatch` (under the lock, unless closed).
  void writable_again(const std::function<void()>& unwatch);
  /// Writes a heartbeat's sealed `header`, or what is left of the last one, without waiting:
  /// skipped while a sender has the turn or the lock is taken.
  void beat(const char* header, std::size_t bytes);

 private:
  const int fd_;
  std::mutex mutex_;  // guards every member below but the seal and the ring
  bool closed_ = false;
  bool fd_closed_ = false;                   // by close(), or by the sender it found writing
  bool writing_ = false;                     // a sender has the turn
  const void* turn_loop_ = nullptr;          // the event loop whose thread holds the turn, if any
  std::vector<Promise<bool>> turn_waiters_;  // fibers waiting for the turn
  std::condition_variable turn_free_;        // threads waiting for it
  int threads_waiting_ = 0;
  std::optional<Promise<bool>> writable_;  // the turn's wait for a full socket
  std::vector<char> owed_;                 // a heartbeat's bytes a full socket did not take
  // The turn's: set before any sender, then used by whoever has the turn, or by a heartbeat
  // under mutex_ while no one has it.
  std::unique_ptr<FrameSeal> seal_;
  std::unique_ptr<SendRing> ring_;
  bool ring_refused_ = false;
  std::atomic<SendRing*> ring_to_wake_{nullptr};  // close() interrupts a wait on it
  std::atomic<bool> broken_{false};
};

}  // namespace push::dist::detail
