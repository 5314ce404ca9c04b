#pragma once
// One connection of the RPC transport: what its senders share (under send_mutex) and
// the reader's state, which only the I/O thread touches (transport.cpp, transport_read.cpp).
//
// Senders take turns (transport_write.cpp): one writes a whole frame while the others wait
// for the turn, and a writer whose peer does not take its bytes (a full socket or ring)
// waits without holding send_mutex, suspending its fiber where it runs in one, so that a
// loop serving other peers goes on.
#include <push/core/future.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "dist/transport/frame_seal.h"
#include "dist/transport/handshake.h"
#include "dist/transport/shm_ring.h"
#include "dist/transport/wire.h"

namespace push::dist::detail {

/// Bytes read from a socket at a time; larger tensor data goes straight into its tensor.
constexpr std::size_t kStagingBytes = std::size_t{64} << 10;
/// epoll tags of the listening socket and the wake eventfd (a connection's is its address).
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(int fd_, bool outgoing_, int peer_) : fd(fd_), outgoing(outgoing_), peer(peer_), introduced(outgoing_) {
    if (introduced) staging.resize(kStagingBytes);
  }

  int fd;
  const bool outgoing;
  int peer;         // group rank; -1 until an incoming connection has proved which
  bool introduced;  // outgoing, or incoming and the handshake (handshake.h) passed
  std::mutex send_mutex;
  bool closed = false;     // guarded by send_mutex: close() began, nothing more is sent
  bool fd_closed = false;  // guarded by send_mutex: by close(), or by the writer it found writing
  // Guarded by send_mutex: whether a sender has the turn, and who waits for it (fibers on a
  // promise, threads that cannot suspend on the condition variable).
  bool writing = false;
  const void* turn_loop = nullptr;  // the event loop whose thread holds the turn, if any
  std::vector<Promise<bool>> turn_waiters;
  std::condition_variable turn_free;
  int threads_waiting = 0;  // on turn_free
  // Guarded by send_mutex: the writer's wait for a full socket to take bytes again; the I/O
  // thread keeps the fd's EPOLLOUT on while it is set and completes it.
  std::optional<Promise<bool>> writable;
  // Shared memory (shm_ring.h): this side's ring for what it sends on this connection.
  std::unique_ptr<SendRing> send_ring;  // the write turn's
  bool ring_refused = false;            // the write turn's: none could be made
  std::vector<char> owed;               // guarded by send_mutex: a heartbeat's bytes a full socket did not take
  std::atomic<SendRing*> ring_to_wake{nullptr};
  std::atomic<bool> broken{false};  // close() began: a sender waiting on the ring gives up
  bool gone = false;                // I/O thread: closed; events still in its batch are ignored
  // Set once the handshake passed (frame_seal.h). send_seal: the write turn's, or a
  // heartbeat's under send_mutex while no sender has the turn. recv_seal: the I/O thread's.
  std::unique_ptr<FrameSeal> send_seal;
  std::unique_ptr<FrameSeal> recv_seal;

  /// Seals this connection's frames from now on, with the keys its handshake gave.
  void seal_with(const handshake::SessionKeys& keys, bool encrypt) {
    send_seal = std::make_unique<FrameSeal>(outgoing ? keys.dialer_to_listener : keys.listener_to_dialer,
                                            /*sending=*/true, encrypt);
    recv_seal = std::make_unique<FrameSeal>(outgoing ? keys.listener_to_dialer : keys.dialer_to_listener,
                                            /*sending=*/false, encrypt);
  }

  // The reader's state (I/O thread only).
  // Incoming, before it is introduced: the handshake's fixed-size frames, nothing else.
  enum class Handshake { kHello, kProof };
  Handshake handshake = Handshake::kHello;
  push::detail::Clock::time_point handshake_deadline;
  char handshake_in[handshake::kHelloBytes];  // the hello or the proof being read
  std::size_t handshake_got = 0;
  handshake::Bytes dialer_nonce{}, listener_nonce{};

  // A frame: its header, meta and head tag, then (when it has data) the data and its tag.
  enum class Stage { kHeader, kMeta, kHeadTag, kData, kDataTag };
  Stage stage = Stage::kHeader;
  std::vector<char> staging;  // kStagingBytes once introduced: nothing before
  std::size_t begin = 0, end = 0;
  char header_bytes[wire::kHeaderBytes];
  std::size_t header_got = 0;
  wire::Header header;
  std::vector<char> meta;  // grows with the bytes that arrive, not with the bytes announced
  std::vector<at::Tensor> tensors;
  std::size_t tensor_index = 0;
  uint64_t tensor_got = 0;
  uint64_t skip = 0;                    // data bytes to discard (the table was malformed)
  std::exception_ptr table_error;       // why
  std::unique_ptr<RecvRing> recv_ring;  // the peer's ring, once announced
  uint64_t ring_left = 0;               // kRingData frame: data bytes still to come through it
  char note[8];                         // kRingData frame: the note being read
  std::size_t note_got = 0;
  uint8_t tag[kTagBytes];  // the tag being read
  std::size_t tag_got = 0;

  /// Where the current tensor's next bytes go, and how many it still needs.
  std::pair<char*, uint64_t> tensor_window() {
    while (tensor_index < tensors.size() && tensor_got == tensors[tensor_index].nbytes()) {
      ++tensor_index;
      tensor_got = 0;
    }
    if (tensor_index == tensors.size()) return {nullptr, 0};
    auto& t = tensors[tensor_index];
    return {static_cast<char*>(t.data_ptr()) + tensor_got, t.nbytes() - tensor_got};
  }
  bool ring_data() const { return (header.flags & wire::kRingData) != 0; }
  bool data_complete() {
    if (ring_data()) return ring_left == 0;
    if (skip > 0) return false;
    return tensor_window().first == nullptr;
  }
};

}  // namespace push::dist::detail
