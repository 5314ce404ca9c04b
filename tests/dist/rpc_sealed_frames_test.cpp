// Every frame after the handshake is sealed (src/dist/transport/frame_seal.h, docs/distributed.md
// "Every frame"): a frame changed on the way, replayed, or sealed for another connection
// closes its connection and names the peer; the member goes on serving the others. Off the
// host the bytes are encrypted; within it they travel as they are, authenticated.
#include "dist_test_util.h"
#include "raw_peer.h"
#include "solo_member.h"

#include "dist/transport/frame_seal.h"
#include "dist/transport/handshake.h"

#include <test_util.h>

#include <cstring>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::testing::RawPeer;
using push::testing::SoloMember;
namespace wire = push::dist::detail::wire;
namespace hs = push::dist::detail::handshake;
using push::dist::detail::FrameSeal;
using push::dist::detail::kTagBytes;
using push::dist::detail::Tag;

namespace {

c10::IValue sealed_echo(const RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(sealed_echo);

/// Seals `head` and `meta` as one segment of `seal`, the way a frame's head travels.
std::vector<char> sealed_segment(FrameSeal& seal, const std::string& head, const std::string& meta) {
  const std::vector<char> m(meta.begin(), meta.end());
  return push::dist::detail::seal_head(seal, head.data(), head.size(), m);
}

/// Opens what sealed_segment made: whether its tag is right (the meta decrypted in place).
bool open_segment(FrameSeal& seal, std::vector<char>& bytes, std::size_t head) {
  seal.begin();
  seal.authenticate(bytes.data(), head);
  const std::size_t meta = bytes.size() - head - kTagBytes;
  seal.crypt(bytes.data() + head, bytes.data() + head, meta);
  return seal.open(reinterpret_cast<const uint8_t*>(bytes.data() + head + meta));
}

}  // namespace

TEST(FrameSeal, ASegmentOpensOnlyAsSealedInItsPlaceInTheStream) {
  const hs::Bytes key = hs::random_bytes();
  for (const bool encrypt : {false, true}) {
    FrameSeal out(key, /*sending=*/true, encrypt), in(key, /*sending=*/false, encrypt);
    const std::string head(32, 'h'), meta = "the meta of a frame";
    auto first = sealed_segment(out, head, meta);
    auto second = sealed_segment(out, head, meta);
    // The meta is encrypted off the host, and travels as it is within it.
    const bool clear = std::string(first.begin() + 32, first.begin() + 32 + meta.size()) == meta;
    EXPECT_EQ(clear, !encrypt);
    EXPECT_NE(first, second) << "two segments, two nonces: same bytes, different tags";
    auto copy = first;
    ASSERT_TRUE(open_segment(in, copy, head.size()));
    EXPECT_EQ(std::string(copy.begin() + 32, copy.begin() + 32 + meta.size()), meta);
    // Replayed: the receiver now expects the second segment.
    copy = first;
    EXPECT_FALSE(open_segment(in, copy, head.size()));
    // Each byte of header, meta or tag changed: refused.
    for (std::size_t i : {std::size_t{0}, std::size_t{31}, std::size_t{32}, first.size() - 1}) {
      FrameSeal fresh(key, false, encrypt);
      auto changed = first;
      changed[i] ^= 1;
      EXPECT_FALSE(open_segment(fresh, changed, head.size())) << "byte " << i;
    }
    // Another key (the other direction's, another connection's): refused.
    hs::Bytes other = key;
    other[5] ^= 1;
    FrameSeal stranger(other, false, encrypt);
    copy = first;
    EXPECT_FALSE(open_segment(stranger, copy, head.size()));
  }
}

TEST(FrameSeal, SealingInPiecesIsSealingAtOnce) {
  const hs::Bytes key = hs::random_bytes();
  std::string data(100000, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  for (const bool encrypt : {false, true}) {
    FrameSeal whole(key, true, encrypt), pieces(key, true, encrypt);
    std::vector<char> a(data.size()), b(data.size());
    whole.begin();
    whole.crypt(data.data(), a.data(), data.size());
    pieces.begin();
    for (std::size_t at = 0, step = 1; at < data.size(); at += step, step = step * 3 + 1) {
      const std::size_t n = std::min(step, data.size() - at);
      pieces.crypt(data.data() + at, b.data() + at, n);
    }
    EXPECT_EQ(a, b);
    const Tag ta = whole.seal(), tb = pieces.seal();
    EXPECT_EQ(ta, tb);
    // Opened in place, in other pieces.
    FrameSeal in(key, false, encrypt);
    in.begin();
    in.crypt(a.data(), a.data(), 12345);
    in.crypt(a.data() + 12345, a.data() + 12345, a.size() - 12345);
    EXPECT_TRUE(in.open(ta.data()));
    EXPECT_EQ(std::string(a.begin(), a.end()), data);
  }
}

TEST(FrameSeal, EachConnectionAndDirectionHasItsOwnKeyAndOnlyOffHostLinksAreEncrypted) {
  const hs::Bytes key = hs::random_bytes(), n1 = hs::random_bytes(), n2 = hs::random_bytes();
  const auto a = hs::session_keys(key, n1, n2, 0, 1, "127.0.0.1:5000");
  EXPECT_NE(a.dialer_to_listener, a.listener_to_dialer);
  EXPECT_NE(a.dialer_to_listener, hs::session_keys(key, n2, n1, 0, 1, "127.0.0.1:5000").dialer_to_listener);
  EXPECT_NE(a.dialer_to_listener, hs::session_keys(key, n1, n2, 1, 0, "127.0.0.1:5000").dialer_to_listener);
  EXPECT_NE(a.dialer_to_listener, hs::session_keys(key, n1, n2, 0, 1, "127.0.0.1:5001").dialer_to_listener);
  EXPECT_EQ(a.dialer_to_listener, hs::session_keys(key, n1, n2, 0, 1, "127.0.0.1:5000").dialer_to_listener);
  EXPECT_FALSE(hs::encrypts("127.0.0.1:5000"));
  EXPECT_FALSE(hs::encrypts("127.3.2.1:5000"));
  EXPECT_TRUE(hs::encrypts("169.254.10.2:5000"));
  EXPECT_TRUE(hs::encrypts("10.0.0.1:5000"));
}

TEST(RpcSealed, AFrameChangedOnTheWayClosesItsConnectionAndNamesThePeer) {
  SoloMember m;
  testing::internal::CaptureStderr();
  bool closed = false;
  {
    RawPeer peer(m.port(), m.key());
    auto bytes = peer.seal(RawPeer::call_frame(1, "sealed_echo", {torch::arange(8.0)}));
    bytes[wire::kHeaderBytes + 3] ^= 0x10;  // a byte of the meta
    ASSERT_TRUE(peer.write_unsealed(bytes));
    EXPECT_FALSE(peer.read_reply(1s));
    closed = peer.closed_within(10s);
  }
  // The member's I/O thread reports a closed connection before it reads the next one.
  EXPECT_TRUE(m.answers());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(closed);
  EXPECT_NE(err.find("closed the connection from " + m.world.name() + " (rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("a frame failed authentication"), std::string::npos) << err;
}

TEST(RpcSealed, TensorBytesChangedOnTheWayAreNeverDelivered) {
  SoloMember m;
  for (const std::size_t floats : {std::size_t{16}, std::size_t{1} << 18}) {  // staged; read into the tensor
    RawPeer peer(m.port(), m.key());
    auto bytes = peer.seal(RawPeer::call_frame(1, "sealed_echo", {torch::zeros({static_cast<int64_t>(floats)})}));
    bytes[bytes.size() - kTagBytes - 5] ^= 0x40;  // a byte of the tensor's data
    ASSERT_TRUE(peer.write_unsealed(bytes));
    EXPECT_FALSE(peer.read_reply(1s)) << floats << " floats";
    EXPECT_TRUE(peer.closed_within(10s));
  }
  EXPECT_TRUE(m.answers());
}

TEST(RpcSealed, AFrameReplayedOrSealedForAnotherConnectionIsRefused) {
  SoloMember m;
  std::vector<char> recorded;
  {
    RawPeer peer(m.port(), m.key());
    recorded = peer.seal(RawPeer::call_frame(1, "solo_answer", {}));
    ASSERT_TRUE(peer.write_unsealed(recorded));
    ASSERT_TRUE(peer.read_reply(10s));
    ASSERT_TRUE(peer.write_unsealed(recorded));  // the same frame again on its connection
    EXPECT_FALSE(peer.read_reply(1s));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  {
    RawPeer peer(m.port(), m.key());  // a new connection, new session keys
    ASSERT_TRUE(peer.write_unsealed(recorded));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  {
    // A heartbeat without its tag, from a peer that proved itself: the header alone is
    // not taken for a sign of life; the connection closes at the bytes that follow.
    RawPeer peer(m.port(), m.key());
    std::vector<char> beat(wire::kHeaderBytes);
    wire::Header h;
    h.type = wire::kHeartbeat;
    wire::write_header(h, beat.data());
    beat.insert(beat.end(), kTagBytes, 0);
    ASSERT_TRUE(peer.write_unsealed(beat));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  EXPECT_TRUE(m.answers());
}
