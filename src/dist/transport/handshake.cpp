#include "dist/transport/handshake.h"

#include <push/core/errors.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/clock.h"
#include "dist/transport/loopback.h"
#include "dist/transport/rpc_origin.h"
#include "dist/transport/sockets.h"

namespace push::dist::detail::handshake {
namespace {

using push::detail::Clock;

void append(std::string& out, const Bytes& b) { out.append(reinterpret_cast<const char*>(b.data()), b.size()); }

void append(std::string& out, int v) {
  const auto u = static_cast<uint32_t>(v);
  out.append(reinterpret_cast<const char*>(&u), sizeof(u));
}

/// HMAC of what a connection's handshake fixed (both nonces, both ranks, the listener's
/// address) under `purpose` and `part`: the proofs and the session keys are each one.
Bytes transcript_mac(const Bytes& key, std::string_view purpose, std::string_view part, const Bytes& dialer_nonce,
                     const Bytes& listener_nonce, int dialer, int listener, std::string_view listener_address) {
  std::string message(purpose);
  message.append(part);
  message.push_back('\n');
  append(message, dialer_nonce);
  append(message, listener_nonce);
  append(message, dialer);
  append(message, listener);
  message.append(listener_address);
  return hmac(key, message);
}

std::vector<char> frame(uint16_t type, uint64_t id, std::initializer_list<const Bytes*> parts) {
  wire::Header h;
  h.type = type;
  h.id = id;
  h.meta_bytes = static_cast<uint32_t>(parts.size() * kBytes);
  std::vector<char> out(wire::kHeaderBytes);
  wire::write_header(h, out.data());
  for (const Bytes* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

/// Waits for `events` on `fd` until `deadline`; false when it passed first.
bool ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, poll_timeout_ms(deadline, 1000));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the read or write reports the error
    if (Clock::now() >= deadline) return false;
  }
}

void write_all(int fd, const std::vector<char>& bytes, Clock::time_point deadline, const std::string& who) {
  for (std::size_t done = 0; done < bytes.size();) {
    PUSH_CHECK(ready(fd, POLLOUT, deadline), kRpcOrigin, "cannot introduce this member to ", who,
               ": the connection took no bytes before the deadline");
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    PUSH_CHECK(n > 0, kRpcOrigin, "cannot introduce this member to ", who, ": ", std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

void read_all(int fd, char* out, std::size_t bytes, Clock::time_point deadline, const std::string& who) {
  for (std::size_t done = 0; done < bytes;) {
    PUSH_CHECK(ready(fd, POLLIN, deadline), kRpcOrigin, who,
               " did not answer this member's hello in time (is something else listening at its address?)");
    const ssize_t n = ::recv(fd, out + done, bytes - done, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    PUSH_CHECK(n != 0, kRpcOrigin, who,
               " closed the connection during the handshake: it does not take this member for one of its group (a "
               "different job, or a different job secret)");
    PUSH_CHECK(n > 0, kRpcOrigin, "handshake with ", who, " failed: ", std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

Bytes random_bytes() {
  Bytes out;
  for (std::size_t done = 0; done < out.size();) {
    const ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    PUSH_CHECK(n > 0, kRpcOrigin, "cannot draw random bytes: ", std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  return out;
}

Bytes hmac(const Bytes& key, std::string_view message) {
  Bytes out;
  unsigned int len = 0;
  const auto* done = ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &len);
  PUSH_CHECK(done != nullptr && len == out.size(), kRpcOrigin, "HMAC-SHA256 failed");
  return out;
}

std::string fingerprint(const Bytes& secret) { return to_hex(hmac(secret, "push job secret fingerprint")); }

Bytes group_key(const Bytes& secret, const std::string& prefix) {
  return hmac(secret, "push rpc group key\n" + prefix);
}

Bytes proof(const Bytes& key, std::string_view role, const Bytes& dialer_nonce, const Bytes& listener_nonce, int dialer,
            int listener, std::string_view listener_address) {
  return transcript_mac(key, "push rpc handshake\n", role, dialer_nonce, listener_nonce, dialer, listener,
                        listener_address);
}

SessionKeys session_keys(const Bytes& key, const Bytes& dialer_nonce, const Bytes& listener_nonce, int dialer,
                         int listener, std::string_view listener_address) {
  auto derive = [&](std::string_view direction) {
    return transcript_mac(key, "push rpc session key\n", direction, dialer_nonce, listener_nonce, dialer, listener,
                          listener_address);
  };
  return {derive("dialer to listener"), derive("listener to dialer")};
}

bool encrypts(std::string_view listener_address) {
  return !is_loopback(listener_address.substr(0, listener_address.rfind(':')));
}

bool same(const Bytes& a, const Bytes& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

std::string to_hex(const Bytes& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

Bytes from_hex(const std::string& text, const char* what) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  bool ok = text.size() == 2 * kBytes;
  Bytes out{};
  for (std::size_t i = 0; ok && i < kBytes; ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    ok = hi >= 0 && lo >= 0;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  PUSH_CHECK(ok, "push::dist", what, " must be ", 2 * kBytes, " hexadecimal digits (", kBytes, " random bytes), got ",
             text.size(), " characters");
  return out;
}

wire::Header check_header(const char* in, bool hello, int group_size) {
  const wire::Header h = wire::read_header(in, UINT64_MAX);
  PUSH_CHECK(h.type == (hello ? wire::kHello : wire::kProof), kRpcOrigin,
             "malformed frame: ", hello ? "no hello first" : "no proof after the hello", " (type ", h.type, ")");
  PUSH_CHECK(h.meta_bytes == kBytes && h.data_bytes == 0 && h.tensor_count == 0, kRpcOrigin,
             "malformed frame: a handshake frame of ", h.meta_bytes, " + ", h.data_bytes, " bytes");
  PUSH_CHECK(!hello || h.id < static_cast<uint64_t>(group_size), kRpcOrigin, "a hello claiming group rank ", h.id,
             " in a group of ", group_size);
  return h;
}

std::vector<char> hello_frame(int dialer, const Bytes& dialer_nonce) {
  return frame(wire::kHello, static_cast<uint64_t>(dialer), {&dialer_nonce});
}

std::vector<char> challenge_frame(int listener, const Bytes& listener_nonce, const Bytes& listener_proof) {
  return frame(wire::kChallenge, static_cast<uint64_t>(listener), {&listener_nonce, &listener_proof});
}

std::vector<char> proof_frame(const Bytes& dialer_proof) { return frame(wire::kProof, 0, {&dialer_proof}); }

SessionKeys dial(int fd, const Bytes& key, int dialer, int listener, std::string_view listener_address,
                 Clock::time_point deadline, const std::string& who) {
  const Bytes mine = random_bytes();
  write_all(fd, hello_frame(dialer, mine), deadline, who);
  char in[kChallengeBytes];
  read_all(fd, in, sizeof(in), deadline, who);
  const wire::Header h = wire::read_header(in, 2 * kBytes);
  PUSH_CHECK(h.type == wire::kChallenge && h.meta_bytes == 2 * kBytes && h.data_bytes == 0 &&
                 h.id == static_cast<uint64_t>(listener),
             kRpcOrigin, who, " answered the hello with something other than its challenge");
  Bytes theirs, their_proof;
  std::memcpy(theirs.data(), in + wire::kHeaderBytes, kBytes);
  std::memcpy(their_proof.data(), in + wire::kHeaderBytes + kBytes, kBytes);
  PUSH_CHECK(same(their_proof, proof(key, "listener", mine, theirs, dialer, listener, listener_address)), kRpcOrigin,
             who, " at ", listener_address,
             " could not prove it belongs to this job (its group key differs: another job at its address, or a "
             "different PUSH_JOB_SECRET; or it is not listening there: someone put another address in the store)");
  write_all(fd, proof_frame(proof(key, "dialer", mine, theirs, dialer, listener, listener_address)), deadline, who);
  return session_keys(key, mine, theirs, dialer, listener, listener_address);
}

}  // namespace push::dist::detail::handshake
