#pragma once
// The RPC wire format: one frame per message.
//
//   header (32 bytes, little-endian)
//     u32 magic "PRP3" | u16 type | u16 flags | u64 call id | u32 meta bytes |
//     u32 tensor count | u64 data bytes
//   meta: the tensor table (dtype and sizes of each tensor), then the value, encoded
//         below; tensors in the value are indices into the table
//   data: the bytes of each tensor, in table order, back to back
//
// Tensors travel out of band: the sender writes their bytes straight from their storage
// (gathered with sendmsg), the receiver reads them straight into freshly allocated
// tensors. Nothing is pickled. The value encoding is ours, not LibTorch's pickler, so that
// every length and index is checked before it is used: a frame from a confused or hostile
// peer fails its call, it never crashes the reader (tests/dist/rpc_wire_test.cpp).
//
// Between members on one host, the data of a large message may travel through the
// sender's shared-memory ring instead (flag kRingData; shm_ring.h).
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace push::dist::detail {
class ReceivePool;
}

namespace push::dist::detail::wire {

constexpr uint32_t kMagic = 0x33505250;  // "PRP3": frames sealed after the handshake (frame_seal.h)
constexpr std::size_t kHeaderBytes = 32;
/// Deepest nesting of tuples, lists and dicts a value may have.
constexpr int kMaxDepth = 64;
constexpr int kMaxDims = 32;

enum Type : uint16_t {
  kHello = 1,          // first frame of a connection: id = sender's group rank, meta = nonce (handshake.h)
  kCall = 2,           // ("function", (args...))
  kService = 3,        // ("key", (args...))
  kRemoteCall = 4,     // as kCall; the result stays with the callee, the reply is its id
  kRemoteService = 5,  // as kService, likewise
  kFetchRRef = 6,      // id
  kReleaseRRef = 7,    // id
  kFetchPaired = 8,    // "key"
  kRing = 9,           // the sender's shared-memory ring (shm_ring.h): meta = u64 pid, fd, slot bytes, slots
  kChallenge = 10,     // the listener's answer to a hello (handshake.h)
  kProof = 11,         // the dialer's answer to the challenge (handshake.h)
  kHeartbeat = 12,     // a sign of life, a header alone (transport.h, heartbeat_timeout)
  kReplyOk = 16,       // the result
  kReplyError = 17,    // the error message
};
bool is_request(uint16_t type);
bool is_reply(uint16_t type);
bool is_handshake(uint16_t type);
bool is_known(uint16_t type);

enum Flags : uint16_t {
  kNoReply = 1,     // request: the caller waits for nothing (releases)
  kOwnedValue = 2,  // reply: the value is the id of a value the callee now owns
  kNotHere = 4,     // error reply: the service or paired value named is not held here (any more)
  kRingData = 8,    // the data bytes come through the sender's ring: the stream carries one
                    // u64 note per filled slot (its byte count) in their place
};

struct Header {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint64_t id = 0;
  uint32_t meta_bytes = 0;
  uint32_t tensor_count = 0;
  uint64_t data_bytes = 0;
};

void write_header(const Header& h, char* out);
/// Parses and checks a header against `max_bytes` (meta + data); throws push::Error
/// naming what is wrong (bad magic, unknown type, sizes over the limit).
Header read_header(const char* in, uint64_t max_bytes);

/// A value ready to send: its meta bytes and the tensors whose bytes follow (contiguous,
/// on the CPU).
struct Encoded {
  std::vector<char> meta;
  std::vector<at::Tensor> tensors;
  uint64_t data_bytes = 0;
};
Encoded encode(const c10::IValue& value);

/// The tensor table of received meta bytes: tensors allocated to the announced sizes,
/// for the reader to fill. Throws push::Error when the table is inconsistent with the
/// header (count, total bytes, unknown dtype, negative or overflowing sizes). Large
/// tensors come from `pool` when given.
std::vector<at::Tensor> read_tensor_table(const std::vector<char>& meta, const Header& header,
                                          ReceivePool* pool = nullptr);
/// The value of received meta bytes, over the filled tensors. Throws push::Error.
c10::IValue decode(const std::vector<char>& meta, const std::vector<at::Tensor>& tensors);

/// decode(encode(v)) with the tensors copied: what a receiver would get, without a wire.
c10::IValue copy_value(const c10::IValue& value);

}  // namespace push::dist::detail::wire
