#pragma once
// The listener's side of one incoming connection's handshake (handshake.h), read by the I/O
// thread without ever waiting: the hello, answered at once with the challenge, then the
// proof. Both are fixed-size frames, and nothing past them is read, so a connection that
// has not proved itself costs this object and nothing it can make grow.
#include <cstddef>
#include <string>

#include "core/clock.h"
#include "dist/transport/handshake.h"

namespace push::dist::detail {

/// This member as its handshakes prove it.
struct ListenerIdentity {
  handshake::Bytes key{};  // the group's key
  int rank = -1;           // this member's group rank
  int group_size = 0;
  std::string address;  // where it listens, "a.b.c.d:port"
};

class IncomingHandshake {
 public:
  explicit IncomingHandshake(push::detail::Clock::time_point deadline) : deadline_(deadline) {}

  enum class Step { kWaiting, kProved, kEnded };
  /// Reads what `fd` has and answers a complete hello. kProved: the dialer proved it is
  /// group rank peer(); kWaiting: more bytes are due; kEnded: the connection ended (`why`
  /// says how). Throws push::Error on a malformed frame or a wrong proof.
  Step read(int fd, const ListenerIdentity& me, std::string& why);

  /// The group rank the hello claimed (-1 before it came); proved once read() said so.
  int peer() const { return peer_; }
  /// When the dialer must have proved itself.
  push::detail::Clock::time_point deadline() const { return deadline_; }
  /// The connection's session keys, once proved.
  handshake::SessionKeys keys(const ListenerIdentity& me) const;

 private:
  enum class Expect { kHello, kProof };
  Expect expect_ = Expect::kHello;
  push::detail::Clock::time_point deadline_;
  char in_[handshake::kHelloBytes];  // the hello or the proof being read (same size)
  std::size_t got_ = 0;
  int peer_ = -1;
  handshake::Bytes dialer_nonce_{}, listener_nonce_{};
};

}  // namespace push::dist::detail
