#pragma once
// The wire of push's own store (docs/distributed.md, "The store"): what rank 0's StoreServer
// and each rank's JobStore say to each other.
//
// A connection opens with the store's banner, then the RPC handshake (handshake.h) under the
// store's key, which derives from the job's secret and the job id:
//
//   server -> client   banner    "PUSHSTR1" | HMAC(0, job id) (40 bytes, before anything
//                                 else: a rank of another job is told at once)
//   client -> server   hello     (handshake.h, the client's rank as its group rank)
//   server -> client   challenge the server proves the key (the listener is rank 0)
//   client -> server   proof     the client proves it; both now hold the session keys
//
// Every message after that is two sealed segments (frame_seal.h) under the direction's key:
//
//   u32 body bytes | tag          the head: 20 bytes, opened before anything is allocated
//   body | tag                    encrypted where the link leaves the host
//
// A request's body is a u8 Op and its fields; a reply's is a u8 Status and its fields.
// Strings travel as u32 length | bytes, integers little-endian.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dist/transport/frame_seal.h"

namespace push::dist::detail::store_wire {

constexpr std::size_t kBannerBytes = 40;
constexpr std::size_t kHeadBytes = 4 + kTagBytes;
/// The largest body either side reads: 64 MiB (a value, or a reply to a check of many keys).
constexpr uint32_t kMaxBody = 64u << 20;
/// The longest key and the most keys in one request.
constexpr std::size_t kMaxKeyBytes = 4096;
constexpr std::size_t kMaxKeys = 4096;
/// The longest a get or a wait waits (a week): longer timeouts are cut to it, so that no
/// deadline overflows.
constexpr int64_t kMaxWaitMs = int64_t{7} * 24 * 3600 * 1000;

enum class Op : uint8_t {
  kSet = 1,         // key, value                -> ok
  kGet = 2,         // key, timeout ms           -> ok value | timeout (waits for the key)
  kAdd = 3,         // key, i64 delta            -> ok i64 (the new value)
  kCompareSet = 4,  // key, expected, desired    -> ok value (the value after the call)
  kCheck = 5,       // keys                      -> ok u8 (all there)
  kDelete = 6,      // key                       -> ok u8 (it was there)
  kNumKeys = 7,     //                           -> ok i64
  kWait = 8,        // keys, timeout ms          -> ok | timeout
};
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

/// The banner of the store serving job `job_id`.
std::vector<char> banner(const std::string& job_id);

/// The store's key in the job with secret `secret` and id `job_id`.
handshake::Bytes store_key(const handshake::Bytes& secret, const std::string& job_id);

/// The numeric address ("a.b.c.d:port", "[v6]:port") of socket `fd`'s own end (`peer`
/// false) or its peer's: both sides of a connection name the server's end alike, which the
/// handshake's proofs bind.
std::string address_of(int fd, bool peer);

/// A body being written.
class Writer {
 public:
  explicit Writer(uint8_t first) { out_.push_back(static_cast<char>(first)); }
  Writer& u8(uint8_t v);
  Writer& i64(int64_t v);
  Writer& bytes(std::string_view v);
  Writer& strings(const std::vector<std::string>& v);
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

/// A body being read; every read checks what is left and throws push::Error naming a
/// malformed message from `who`.
class Reader {
 public:
  Reader(std::string_view body, const char* who) : rest_(body), who_(who) {}
  uint8_t u8();
  int64_t i64();
  std::string bytes(std::size_t most);
  std::vector<std::string> strings();
  /// Throws unless everything was read.
  void done() const;

 private:
  std::string_view take(std::size_t n);
  std::string_view rest_;
  const char* who_;
};

/// A request, decoded (every length checked against the limits above).
struct Request {
  Op op{};
  std::vector<std::string> keys;  // one, except for a check or a wait
  std::string value;              // a set's value; a compare-and-set's expected value
  std::string desired;            // a compare-and-set's new value
  int64_t number = 0;             // an add's delta; a get's or wait's timeout in ms
};
/// Throws push::Error naming what is malformed.
Request decode_request(std::string_view body);
std::string encode_request(const Request& request);

/// `body` as it travels: head and body segments sealed by `seal`.
std::vector<char> seal_message(FrameSeal& seal, std::string_view body);
/// Opens a head (kHeadBytes at `head`): the body's length, or -1 when the tag fails or the
/// length is over kMaxBody.
int64_t open_head(FrameSeal& seal, const char* head);
/// Opens the body and its tag (`bytes` + kTagBytes at `in`) in place; false when the tag fails.
bool open_body(FrameSeal& seal, char* in, std::size_t bytes);

}  // namespace push::dist::detail::store_wire
