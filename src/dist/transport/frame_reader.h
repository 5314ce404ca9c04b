#pragma once
// The reading side of one connection once its handshake passed: assembles frames from what
// the socket gives (through a staging buffer; large tensor bytes straight into their
// tensors), opens each segment with the connection's seal (frame_seal.h), maps the peer's
// shared-memory ring when it is announced and empties its slots, and hands each complete
// message on. Only the I/O thread uses it.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/transport/frame_seal.h"
#include "dist/transport/receive_pool.h"
#include "dist/transport/shm_ring.h"
#include "dist/transport/wire.h"

namespace push::dist::detail {

/// Bytes read from a socket at a time; larger tensor data goes straight into its tensor.
constexpr std::size_t kStagingBytes = std::size_t{64} << 10;

/// A fixed-size field of a frame (its header, a tag, a ring note), filled as bytes arrive.
template <std::size_t N>
struct Gathered {
  char bytes[N];
  std::size_t got = 0;
  /// Takes what is still missing from the `avail` bytes at `src`; returns how many it took.
  std::size_t take(const char* src, std::size_t avail) {
    const std::size_t n = std::min(avail, N - got);
    std::memcpy(bytes + got, src, n);
    got += n;
    return n;
  }
  /// Whether it is complete; then it is emptied for the next one (its bytes stay readable).
  bool complete() {
    if (got < N) return false;
    got = 0;
    return true;
  }
};

/// The tensors of the message being read, filled in order.
class TensorFill {
 public:
  void reset(std::vector<at::Tensor> tensors) {
    tensors_ = std::move(tensors);
    index_ = 0;
    got_ = 0;
  }
  /// Where the current tensor's next bytes go and how many it still needs; {null, 0} when
  /// every tensor is full.
  std::pair<char*, uint64_t> window();
  void filled(uint64_t bytes) { got_ += bytes; }
  bool complete() { return window().first == nullptr; }
  std::vector<at::Tensor> take() { return std::move(tensors_); }

 private:
  std::vector<at::Tensor> tensors_;
  std::size_t index_ = 0;
  uint64_t got_ = 0;
};

/// The peer's shared-memory ring as the reader sees it: mapped when a kRing frame announces
/// it, then emptied one note (a filled slot, announced on the stream) at a time.
class RingInbox {
 public:
  bool mapped() const { return ring_ != nullptr; }
  /// A kRing frame's `meta`: maps the peer's ring. Throws push::Error.
  void map(const wire::Header& header, const std::vector<char>& meta);
  /// A frame whose `bytes` data bytes come through the ring begins.
  void expect(uint64_t bytes) {
    left_ = bytes;
    note_.got = 0;
  }
  bool done() const { return left_ == 0; }
  /// Takes what it needs of the `avail` bytes at `src` for the note being read (opened with
  /// `seal`); a complete note empties its slot into `tensors`, or drops it when `drop`.
  /// Returns how many bytes it took. Throws push::Error on a note that does not fit.
  std::size_t consume(const char* src, std::size_t avail, FrameSeal& seal, TensorFill& tensors, bool drop);

 private:
  std::unique_ptr<RecvRing> ring_;
  uint64_t left_ = 0;  // data bytes still to come through it
  Gathered<8> note_;
};

class FrameReader {
 public:
  /// A complete message: `value` is null and `error` set when its frame was intact but its
  /// value malformed.
  using Deliver = std::function<void(const wire::Header&, c10::IValue value, std::exception_ptr error)>;

  /// Frames opened with `seal`; tensor buffers from `pool`; no message over `max_message_bytes`.
  FrameReader(std::unique_ptr<FrameSeal> seal, ReceivePool* pool, uint64_t max_message_bytes);

  /// Reads what `fd` has (at most 64 reads, so that other connections get their turn),
  /// calling `deliver` for each complete message. False when the connection ended (`why`
  /// says how). Throws push::Error on a malformed frame or one that fails authentication.
  bool read(int fd, const Deliver& deliver, std::string& why);

 private:
  enum class Stage { kHeader, kMeta, kHeadTag, kData, kDataTag };
  /// Takes what the current stage needs of the `avail` staged bytes at `src`; returns how many.
  std::size_t consume(char* src, std::size_t avail, const Deliver& deliver);
  /// A complete header: checks it and starts the frame's head segment.
  void header_read();
  /// The head passed its tag: acts on it (a heartbeat, a ring, a message's tensors).
  void head_opened(const Deliver& deliver);
  /// The message is complete: decodes it and hands it on.
  void finish(const Deliver& deliver);
  bool ring_data() const { return (header_.flags & wire::kRingData) != 0; }
  bool data_complete();

  std::unique_ptr<FrameSeal> seal_;
  ReceivePool* pool_;
  uint64_t max_message_bytes_;
  Stage stage_ = Stage::kHeader;
  std::vector<char> staging_;
  std::size_t begin_ = 0, end_ = 0;  // the staged bytes not consumed yet
  Gathered<wire::kHeaderBytes> header_bytes_;
  wire::Header header_;
  std::vector<char> meta_;  // grows with the bytes that arrive, not with the bytes announced
  TensorFill tensors_;
  uint64_t skip_ = 0;               // data bytes to discard (the tensor table was malformed)
  std::exception_ptr table_error_;  // why
  RingInbox ring_;
  Gathered<kTagBytes> tag_;
};

}  // namespace push::dist::detail
