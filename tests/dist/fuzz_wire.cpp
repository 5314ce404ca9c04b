#include "fuzz_wire.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "dist/rendezvous/sealed_value.h"
#include "dist/rendezvous/store_wire.h"
#include "dist/transport/frame_seal.h"
#include "dist/transport/handshake.h"
#include "dist/transport/wire.h"

namespace push::testing {
namespace {

namespace wire = dist::detail::wire;
namespace hs = dist::detail::handshake;

constexpr uint64_t kLimit = uint64_t{1} << 20;  // max_message_bytes of the fuzzed member

void frame(const char* in, std::size_t size) {
  if (size < wire::kHeaderBytes) return;
  const wire::Header h = wire::read_header(in, kLimit);
  in += wire::kHeaderBytes;
  size -= wire::kHeaderBytes;
  if (h.meta_bytes > size) return;  // a member would wait for the rest
  const std::vector<char> meta(in, in + h.meta_bytes);
  in += h.meta_bytes;
  size -= h.meta_bytes;
  auto tensors = wire::read_tensor_table(meta, h);
  for (auto& t : tensors) {
    const std::size_t n = std::min<std::size_t>(t.nbytes(), size);
    if (n > 0) std::memcpy(t.data_ptr(), in, n);
    in += n;
    size -= n;
  }
  (void)wire::decode(meta, tensors);
}

hs::Bytes take(const char* in) {
  hs::Bytes b;
  std::memcpy(b.data(), in, b.size());
  return b;
}

void listener(const char* in, std::size_t size) {
  if (size < 2 * hs::kHelloBytes) return;
  const hs::Bytes key{};
  const wire::Header hello = hs::check_header(in, /*hello=*/true, 4);
  const hs::Bytes dialer_nonce = take(in + wire::kHeaderBytes), listener_nonce{};
  in += hs::kHelloBytes;
  hs::check_header(in, /*hello=*/false, 4);
  const bool proved = hs::same(take(in + wire::kHeaderBytes), hs::proof(key, "dialer", dialer_nonce, listener_nonce,
                                                                        static_cast<int>(hello.id), 0, "127.0.0.1:1"));
  (void)proved;
}

void dialer(const char* in, std::size_t size) {
  if (size < hs::kChallengeBytes) return;
  const wire::Header h = wire::read_header(in, 2 * hs::kBytes);
  if (h.type != wire::kChallenge || h.meta_bytes != 2 * hs::kBytes) return;
  const hs::Bytes key{}, mine{};
  (void)hs::same(
      take(in + wire::kHeaderBytes + hs::kBytes),
      hs::proof(key, "listener", mine, take(in + wire::kHeaderBytes), 0, static_cast<int>(h.id), "127.0.0.1:1"));
}

/// A member's address as another member reads it from the store: the seal checked
/// (rpc_state.cpp), once on the bytes as they are and once on them sealed with the key.
void store_value(const char* in, std::size_t size) {
  const hs::Bytes key{};
  const std::string store_key = "push/rpc/g#0/addr/1";
  const std::string bytes(in, size);
  const std::string sealed = push::dist::detail::seal(key, store_key, bytes);
  if (push::dist::detail::unseal(key, store_key, sealed, "a fuzzed address") != bytes) std::abort();
  (void)push::dist::detail::unseal(key, store_key, bytes, "a fuzzed address");
}

/// A member's reader on a stream of sealed frames (frame_reader.cpp): each head opened
/// before its tensors are allocated, each data segment before the value is decoded. When
/// `sealed_here` (the stream was sealed with this key just now) every tag must open.
void open_frames(const char* in, std::size_t size, bool encrypt, bool sealed_here) {
  namespace d = dist::detail;
  const hs::Bytes key{};
  d::FrameSeal seal(key, /*sending=*/false, encrypt);
  auto open_tag = [&](const char* tag) {
    if (seal.open(reinterpret_cast<const uint8_t*>(tag))) return true;
    if (sealed_here) std::abort();
    return false;
  };
  while (size >= wire::kHeaderBytes) {
    const wire::Header h = wire::read_header(in, kLimit);
    if (size - wire::kHeaderBytes < h.meta_bytes + d::kTagBytes) return;
    seal.begin();
    seal.authenticate(in, wire::kHeaderBytes);
    std::vector<char> meta(in + wire::kHeaderBytes, in + wire::kHeaderBytes + h.meta_bytes);
    seal.crypt(meta.data(), meta.data(), meta.size());
    in += wire::kHeaderBytes + h.meta_bytes;
    size -= wire::kHeaderBytes + h.meta_bytes;
    if (!open_tag(in)) return;
    in += d::kTagBytes;
    size -= d::kTagBytes;
    if (h.data_bytes == 0) continue;
    if (size < h.data_bytes + d::kTagBytes) return;
    std::vector<at::Tensor> tensors;
    try {
      tensors = wire::read_tensor_table(meta, h);
    } catch (const std::exception&) {
      tensors.clear();  // the data is skipped, its tag still checked
    }
    seal.begin();
    std::vector<char> data(in, in + h.data_bytes);
    seal.crypt(data.data(), data.data(), data.size());
    in += h.data_bytes;
    size -= h.data_bytes;
    if (!open_tag(in)) return;
    in += d::kTagBytes;
    size -= d::kTagBytes;
    std::size_t at = 0;
    for (auto& t : tensors) {
      if (t.nbytes() > 0) std::memcpy(t.data_ptr(), data.data() + at, t.nbytes());
      at += t.nbytes();
    }
    try {
      (void)wire::decode(meta, tensors);
    } catch (const std::exception&) {
      // the call fails; the stream goes on
    }
  }
}

/// The whole frames at the front of `in`, sealed as a sender seals them.
std::vector<char> seal_frames(const char* in, std::size_t size, bool encrypt) {
  namespace d = dist::detail;
  const hs::Bytes key{};
  d::FrameSeal seal(key, /*sending=*/true, encrypt);
  std::vector<char> out;
  while (size >= wire::kHeaderBytes) {
    uint32_t meta_bytes = 0;
    uint64_t data_bytes = 0;
    std::memcpy(&meta_bytes, in + 16, sizeof(meta_bytes));
    std::memcpy(&data_bytes, in + 24, sizeof(data_bytes));
    if (size - wire::kHeaderBytes < meta_bytes || size - wire::kHeaderBytes - meta_bytes < data_bytes) break;
    const std::vector<char> meta(in + wire::kHeaderBytes, in + wire::kHeaderBytes + meta_bytes);
    const auto head = d::seal_head(seal, in, wire::kHeaderBytes, meta);
    out.insert(out.end(), head.begin(), head.end());
    in += wire::kHeaderBytes + meta_bytes;
    size -= wire::kHeaderBytes + meta_bytes;
    if (data_bytes == 0) continue;
    seal.begin();
    const std::size_t at = out.size();
    out.resize(at + data_bytes);
    seal.crypt(in, out.data() + at, data_bytes);
    const d::Tag tag = seal.seal();
    out.insert(out.end(), tag.begin(), tag.end());
    in += data_bytes;
    size -= data_bytes;
  }
  return out;
}

/// Bytes as a stream of sealed frames (tags that almost never open), and the same bytes
/// sealed as frames first (every tag opens; what is behind them is fuzzed).
void sealed_frames(const char* in, std::size_t size) {
  for (const bool encrypt : {false, true}) {
    try {
      open_frames(in, size, encrypt, /*sealed_here=*/false);
    } catch (const std::exception&) {
      // the connection closes
    }
    const auto sealed = seal_frames(in, size, encrypt);
    try {
      open_frames(sealed.data(), sealed.size(), encrypt, /*sealed_here=*/true);
    } catch (const std::exception&) {
      // a header the member refuses: the connection closes
    }
  }
}

/// The store's reader (rendezvous/store_server.cpp) on a stream of sealed messages: each
/// head opened before its body is read, each body opened and decoded as a request. When
/// `sealed_here` every tag must open, and every request that decodes must encode back to
/// the same bytes.
void open_store_messages(const char* in, std::size_t size, bool encrypt, bool sealed_here) {
  namespace d = dist::detail;
  namespace sw = dist::detail::store_wire;
  d::FrameSeal seal(hs::Bytes{}, /*sending=*/false, encrypt);
  while (size >= sw::kHeadBytes) {
    const int64_t bytes = sw::open_head(seal, in);
    if (bytes < 0) {
      if (sealed_here) std::abort();
      return;  // the server closes the connection
    }
    in += sw::kHeadBytes;
    size -= sw::kHeadBytes;
    const auto n = static_cast<std::size_t>(bytes);
    if (size < n + d::kTagBytes) return;  // the server waits for the rest
    std::string body(in, n + d::kTagBytes);
    if (!sw::open_body(seal, body.data(), n)) {
      if (sealed_here) std::abort();
      return;
    }
    body.resize(n);
    in += n + d::kTagBytes;
    size -= n + d::kTagBytes;
    try {
      const sw::Request r = sw::decode_request(body);
      if (sealed_here && sw::encode_request(r) != body) std::abort();
    } catch (const std::exception&) {
      // the server answers with an error; the connection goes on
    }
  }
}

/// Bytes as a stream of sealed store messages, and the same bytes cut into bodies (each
/// after a 2-byte length) and sealed first.
void store_messages(const char* in, std::size_t size) {
  namespace sw = dist::detail::store_wire;
  for (const bool encrypt : {false, true}) {
    open_store_messages(in, size, encrypt, /*sealed_here=*/false);
    dist::detail::FrameSeal seal(hs::Bytes{}, /*sending=*/true, encrypt);
    std::vector<char> sealed;
    for (std::size_t at = 0; at + 2 <= size;) {
      uint16_t n = 0;
      std::memcpy(&n, in + at, sizeof(n));
      at += 2;
      n = static_cast<uint16_t>(std::min<std::size_t>(n, size - at));
      const auto message = sw::seal_message(seal, std::string_view(in + at, n));
      sealed.insert(sealed.end(), message.begin(), message.end());
      at += n;
    }
    open_store_messages(sealed.data(), sealed.size(), encrypt, /*sealed_here=*/true);
  }
}

}  // namespace

int fuzz_wire(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto* in = reinterpret_cast<const char*>(data + 1);
  try {
    switch (data[0] % 6) {
      case 0:
        frame(in, size - 1);
        break;
      case 1:
        listener(in, size - 1);
        break;
      case 2:
        dialer(in, size - 1);
        break;
      case 3:
        store_value(in, size - 1);
        break;
      case 4:
        sealed_frames(in, size - 1);
        break;
      default:
        store_messages(in, size - 1);
        break;
    }
  } catch (const std::exception&) {
    // push::Error or c10::Error: the member closes the connection or fails the call.
  }
  return 0;
}

}  // namespace push::testing
