#include "dist/transport/frame_seal.h"

#include <push/core/errors.h>

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>

#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {
namespace {

// EVP takes int lengths.
constexpr std::size_t kChunk = std::size_t{1} << 30;

}  // namespace

FrameSeal::FrameSeal(const handshake::Bytes& key, bool sending, bool encrypt)
    : ctx_(EVP_CIPHER_CTX_new()), sending_(sending), encrypt_(encrypt) {
  PUSH_CHECK(ctx_ != nullptr, kRpcOrigin, "cannot make a cipher context (out of memory)");
  if (EVP_CipherInit_ex(ctx_, EVP_chacha20_poly1305(), nullptr, key.data(), nullptr, sending ? 1 : 0) != 1) {
    EVP_CIPHER_CTX_free(ctx_);
    throw Error(c10::str("[", kRpcOrigin, "] cannot set up ChaCha20-Poly1305"));
  }
}

FrameSeal::~FrameSeal() { EVP_CIPHER_CTX_free(ctx_); }

void FrameSeal::begin() {
  // The nonce: 4 zero bytes, then the segment's number (little-endian). A connection never
  // seals 2^64 segments.
  uint8_t nonce[12] = {};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(segment_ >> (8 * i));
  ++segment_;
  PUSH_CHECK(EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, -1) == 1, kRpcOrigin,
             "cannot start a sealed segment");
}

void FrameSeal::update(const void* in, void* out, std::size_t n) {
  const auto* from = static_cast<const unsigned char*>(in);
  auto* to = static_cast<unsigned char*>(out);
  while (n > 0) {
    const std::size_t step = std::min(n, kChunk);
    int len = 0;
    PUSH_CHECK(EVP_CipherUpdate(ctx_, to, &len, from, static_cast<int>(step)) == 1, kRpcOrigin,
               "ChaCha20-Poly1305 failed");
    from += step;
    if (to != nullptr) to += step;
    n -= step;
  }
}

void FrameSeal::authenticate(const void* bytes, std::size_t n) {
  if (n > 0) update(bytes, nullptr, n);
}

void FrameSeal::crypt(const void* in, void* out, std::size_t n) {
  if (n == 0) return;
  if (encrypt_) {
    update(in, out, n);
    return;
  }
  update(in, nullptr, n);
  if (out != in) std::memcpy(out, in, n);
}

Tag FrameSeal::seal() {
  PUSH_CHECK(sending_, kRpcOrigin, "FrameSeal::seal on the receiving side");
  int len = 0;
  unsigned char rest[16];
  Tag tag{};
  PUSH_CHECK(EVP_CipherFinal_ex(ctx_, rest, &len) == 1 &&
                 EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, kTagBytes, tag.data()) == 1,
             kRpcOrigin, "cannot seal a segment");
  return tag;
}

bool FrameSeal::open(const uint8_t* tag) {
  PUSH_CHECK(!sending_, kRpcOrigin, "FrameSeal::open on the sending side");
  int len = 0;
  unsigned char rest[16];
  Tag copy;
  std::memcpy(copy.data(), tag, kTagBytes);
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_SET_TAG, kTagBytes, copy.data()) != 1) return false;
  return EVP_CipherFinal_ex(ctx_, rest, &len) == 1;
}

std::vector<char> seal_head(FrameSeal& seal, const char* header, std::size_t header_bytes,
                            const std::vector<char>& meta) {
  std::vector<char> out(header_bytes + meta.size() + kTagBytes);
  std::memcpy(out.data(), header, header_bytes);
  seal.begin();
  seal.authenticate(header, header_bytes);
  seal.crypt(meta.data(), out.data() + header_bytes, meta.size());
  const Tag tag = seal.seal();
  std::memcpy(out.data() + header_bytes + meta.size(), tag.data(), kTagBytes);
  return out;
}

}  // namespace push::dist::detail
