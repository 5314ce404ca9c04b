#pragma once
// A raw TCP client of an RpcGroup member, for tests that speak the wire format by hand
// (src/dist/transport/wire.h): well-formed calls, and malformed or random frames. Once introduced it
// seals what it writes as a member would (src/dist/transport/frame_seal.h): a frame is judged as
// coming from an authenticated peer, however malformed it is.
#include <ATen/core/ivalue.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/transport/frame_seal.h"
#include "dist/transport/handshake.h"
#include "dist/transport/wire.h"

namespace push::testing {

class RawPeer {
 public:
  /// Connects to 127.0.0.1:port and says nothing.
  explicit RawPeer(int port);
  /// Connects and proves it holds `key` (handshake.h) as group rank `rank` to the member of
  /// group rank `listener`. Throws push::Error when the handshake fails.
  RawPeer(int port, const dist::detail::handshake::Bytes& key, int rank = 0, int listener = 0);
  ~RawPeer();
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  /// Seals what it writes and opens what it reads under `keys` from now on: for a test that
  /// made the handshake by hand.
  void seal_with(const dist::detail::handshake::SessionKeys& keys);
  /// Writes bytes, sealed as frames once introduced (split anywhere: the sealing follows
  /// the frames' headers across writes); false when the member has closed the connection.
  bool write(const std::vector<char>& bytes);
  /// Writes bytes as they are: nothing sealed.
  bool write_unsealed(const std::vector<char>& bytes);
  /// What write() would send for `bytes` (advancing the seal's count of segments).
  std::vector<char> seal(const std::vector<char>& bytes);
  /// A call frame: header + encoded ("function", (args...)).
  static std::vector<char> call_frame(uint64_t id, const std::string& function, std::vector<c10::IValue> args,
                                      uint16_t type = dist::detail::wire::kCall);
  /// A frame of `type` with raw meta and data bytes, its header computed from them.
  static std::vector<char> frame(uint16_t type, uint64_t id, const std::vector<char>& meta, uint32_t tensors = 0,
                                 const std::vector<char>& data = {});

  struct Reply {
    dist::detail::wire::Header header;
    c10::IValue value;
  };
  /// The next reply, or nullopt when the connection closed or `timeout` passed.
  std::optional<Reply> read_reply(std::chrono::milliseconds timeout);
  /// True when the member closed the connection within `timeout` (reading and dropping
  /// whatever arrives first).
  bool closed_within(std::chrono::milliseconds timeout);
  /// Exactly `n` bytes, or nullopt when the connection closed or `timeout` passed.
  std::optional<std::vector<char>> read_bytes(std::size_t n, std::chrono::milliseconds timeout);

 private:
  bool read_exact(char* out, std::size_t n, std::chrono::steady_clock::time_point deadline);
  /// Reads a tag and checks it closes the segment `recv_` read; throws push::Error if not.
  bool read_tag(std::chrono::steady_clock::time_point deadline);
  /// Closes the head segment being sealed into `out`, and opens the data segment if any.
  void close_head(std::vector<char>& out);
  int fd_ = -1;
  std::unique_ptr<dist::detail::FrameSeal> send_, recv_;
  // Where write() is in the stream of frames it seals.
  enum class Stage { kHeader, kMeta, kData } stage_ = Stage::kHeader;
  char header_[dist::detail::wire::kHeaderBytes];
  std::size_t header_got_ = 0;
  uint64_t meta_left_ = 0, data_left_ = 0;
  bool ring_data_ = false;
  char note_[8];
  std::size_t note_got_ = 0;
};

}  // namespace push::testing
