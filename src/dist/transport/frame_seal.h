#pragma once
// Every frame after the handshake is authenticated, and encrypted where the link leaves the
// host (docs/distributed.md, "Every frame").
//
// The handshake (handshake.h) gives each connection two fresh session keys, one per
// direction. A frame travels as
//
//   header | meta | tag        the head: header in the clear, meta encrypted off-host
//   data | tag                 only when data_bytes > 0: the tensor bytes (or, through a
//                              shared-memory ring, the stream's notes)
//
// each tag closing one *segment*, sealed with ChaCha20-Poly1305 (RFC 8439) under the
// direction's key with the segment's number as nonce. Both sides count segments, so a
// segment replayed, reordered, dropped or moved to the other direction fails its tag. The
// receiver acts on a head (maps a ring, allocates tensors, counts a heartbeat) only after
// its tag is checked, and delivers a message only after the data's tag is.
//
// Within one host (a listener on 127.x) nothing is encrypted: every byte is authenticated
// data, so the sender still writes tensors straight from their storage and the receiver reads
// them straight into their tensors. Bytes in a shared-memory ring are not sealed: the ring is
// reachable by the job's user only, and announced in a sealed frame.
//
// Why ChaCha20-Poly1305: Poly1305 alone runs at ~15 GB/s here (AVX-512), faster than GMAC,
// and the cipher needs no AES-NI; it is TLS 1.3's other AEAD.
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dist/transport/handshake.h"

struct evp_cipher_ctx_st;

namespace push::dist::detail {

constexpr std::size_t kTagBytes = 16;
using Tag = std::array<uint8_t, kTagBytes>;

/// One direction of one connection: the sender's or the receiver's. Not thread-safe: a
/// sender uses it in its write turn, the receiver on the I/O thread.
class FrameSeal {
 public:
  /// `sending`: this side seals (else it opens); `encrypt`: the link leaves the host.
  FrameSeal(const handshake::Bytes& key, bool sending, bool encrypt);
  ~FrameSeal();
  FrameSeal(const FrameSeal&) = delete;
  FrameSeal& operator=(const FrameSeal&) = delete;

  bool encrypts() const { return encrypt_; }
  /// Starts the next segment.
  void begin();
  /// Bytes that travel in the clear and are authenticated: a header, or any bytes when
  /// nothing is encrypted. Must come before the segment's first crypt().
  void authenticate(const void* bytes, std::size_t n);
  /// Bytes that are encrypted (sending) or decrypted (opening) from `in` into `out`, which
  /// may be the same; without encryption, authenticated and copied (when out != in).
  void crypt(const void* in, void* out, std::size_t n);
  /// Sending: the tag that closes the segment.
  Tag seal();
  /// Opening: whether `tag` closes the segment as its sender sealed it.
  bool open(const uint8_t* tag);

 private:
  void update(const void* in, void* out, std::size_t n);

  evp_cipher_ctx_st* ctx_;
  bool sending_;
  bool encrypt_;
  uint64_t segment_ = 0;  // the next segment's number: its nonce
};

/// A frame's head as it travels, in a segment of its own: `header` (`header_bytes`, in the
/// clear), `meta` (encrypted off-host) and the tag that closes them.
std::vector<char> seal_head(FrameSeal& seal, const char* header, std::size_t header_bytes,
                            const std::vector<char>& meta);

}  // namespace push::dist::detail
