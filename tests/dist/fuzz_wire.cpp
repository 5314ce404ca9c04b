#include "fuzz_wire.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "dist/handshake.h"
#include "dist/sealed_value.h"
#include "dist/wire.h"

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

}  // namespace

int fuzz_wire(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto* in = reinterpret_cast<const char*>(data + 1);
  try {
    switch (data[0] % 4) {
      case 0:
        frame(in, size - 1);
        break;
      case 1:
        listener(in, size - 1);
        break;
      case 2:
        dialer(in, size - 1);
        break;
      default:
        store_value(in, size - 1);
        break;
    }
  } catch (const std::exception&) {
    // push::Error or c10::Error: the member closes the connection or fails the call.
  }
  return 0;
}

}  // namespace push::testing
