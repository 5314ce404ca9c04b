#pragma once
// One connection of the RPC transport: its socket, the group rank at the other end, its
// sending side (write_side.h: the senders' state with its lock) and, for the I/O thread
// alone, its reading side: the handshake of an incoming connection (incoming_handshake.h)
// until it is introduced, then the frame reader (frame_reader.h).
#include <cstdint>
#include <memory>

#include "core/clock.h"
#include "dist/transport/frame_reader.h"
#include "dist/transport/handshake.h"
#include "dist/transport/incoming_handshake.h"
#include "dist/transport/write_side.h"

namespace push::dist::detail {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  /// One this member dialed to group rank `peer`, whose handshake gave `keys`.
  Connection(int fd, int peer, const handshake::SessionKeys& keys, bool encrypt, ReceivePool* pool,
             uint64_t max_message_bytes)
      : fd_(fd), outgoing_(true), peer_(peer), writer_(fd) {
    seal(keys, encrypt, pool, max_message_bytes);
  }
  /// One a peer dialed: in its handshake until `handshake_deadline`.
  Connection(int fd, push::detail::Clock::time_point handshake_deadline)
      : fd_(fd), outgoing_(false), handshake_(std::make_unique<IncomingHandshake>(handshake_deadline)), writer_(fd) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  bool outgoing() const { return outgoing_; }
  /// The group rank at the other end; -1 until an incoming connection proved which.
  int peer() const { return peer_; }
  /// Outgoing, or incoming and its handshake passed.
  bool introduced() const { return reader_ != nullptr; }
  WriteSide& writer() { return writer_; }

  // The I/O thread's.
  /// An incoming connection's handshake, until introduced.
  IncomingHandshake& handshake() { return *handshake_; }
  /// The handshake passed: `peer` proved itself, and frames are sealed from now on.
  void introduce(const handshake::SessionKeys& keys, bool encrypt, ReceivePool* pool, uint64_t max_message_bytes) {
    peer_ = handshake_->peer();
    handshake_.reset();
    seal(keys, encrypt, pool, max_message_bytes);
  }
  FrameReader& reader() { return *reader_; }
  /// Closed: events still in the I/O thread's batch for it are ignored.
  bool gone() const { return gone_; }
  void set_gone() { gone_ = true; }

 private:
  void seal(const handshake::SessionKeys& keys, bool encrypt, ReceivePool* pool, uint64_t max_message_bytes) {
    const auto& send = outgoing_ ? keys.dialer_to_listener : keys.listener_to_dialer;
    const auto& receive = outgoing_ ? keys.listener_to_dialer : keys.dialer_to_listener;
    writer_.seal_with(std::make_unique<FrameSeal>(send, /*sending=*/true, encrypt));
    reader_ = std::make_unique<FrameReader>(std::make_unique<FrameSeal>(receive, /*sending=*/false, encrypt), pool,
                                            max_message_bytes);
  }

  const int fd_;
  const bool outgoing_;
  int peer_ = -1;
  std::unique_ptr<IncomingHandshake> handshake_;
  std::unique_ptr<FrameReader> reader_;
  WriteSide writer_;
  bool gone_ = false;
};

}  // namespace push::dist::detail
