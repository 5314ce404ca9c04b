#include "dist/transport/incoming_handshake.h"

#include <push/core/errors.h>

#include <sys/socket.h>

#include <cstring>

#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"

namespace push::dist::detail {

namespace hs = handshake;
static_assert(hs::kHelloBytes == hs::kProofBytes, "the hello and the proof share one buffer");

IncomingHandshake::Step IncomingHandshake::read(int fd, const ListenerIdentity& me, std::string& why) {
  for (;;) {
    // The header first (checked as soon as it is in), then the 32 bytes after it.
    const std::size_t want = got_ < wire::kHeaderBytes ? wire::kHeaderBytes : hs::kHelloBytes;
    ssize_t n = 0;
    const auto got = receive(fd, in_ + got_, want - got_, n, why);
    if (got == Received::kNothingYet) return Step::kWaiting;
    if (got == Received::kEnd) return Step::kEnded;
    got_ += static_cast<std::size_t>(n);
    const bool hello = expect_ == Expect::kHello;
    if (got_ == wire::kHeaderBytes) {
      const wire::Header h = hs::check_header(in_, hello, me.group_size);
      if (hello) peer_ = static_cast<int>(h.id);
    }
    if (got_ < hs::kHelloBytes) continue;
    got_ = 0;
    if (hello) {
      std::memcpy(dialer_nonce_.data(), in_ + wire::kHeaderBytes, hs::kBytes);
      listener_nonce_ = hs::random_bytes();
      const auto challenge = hs::challenge_frame(
          me.rank, listener_nonce_,
          hs::proof(me.key, "listener", dialer_nonce_, listener_nonce_, peer_, me.rank, me.address));
      // A fresh connection's send buffer takes these few bytes at once; the I/O thread
      // never waits on a peer.
      const ssize_t sent = ::send(fd, challenge.data(), challenge.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      PUSH_CHECK(sent == static_cast<ssize_t>(challenge.size()), kRpcOrigin, "cannot send the challenge");
      expect_ = Expect::kProof;
      continue;
    }
    hs::Bytes theirs;
    std::memcpy(theirs.data(), in_ + wire::kHeaderBytes, hs::kBytes);
    PUSH_CHECK(
        hs::same(theirs, hs::proof(me.key, "dialer", dialer_nonce_, listener_nonce_, peer_, me.rank, me.address)),
        kRpcOrigin, "a wrong proof for group rank ", peer_,
        " (not this job's key, or it dialed another address: a relay)");
    return Step::kProved;
  }
}

hs::SessionKeys IncomingHandshake::keys(const ListenerIdentity& me) const {
  return hs::session_keys(me.key, dialer_nonce_, listener_nonce_, peer_, me.rank, me.address);
}

}  // namespace push::dist::detail
