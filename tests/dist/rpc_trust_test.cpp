// Who gets into an RPC group (docs/distributed.md, "Who gets in"): only a connection that
// proves it holds the group's key, and what a stranger can cost before it has proved
// anything is small and bounded: no allocation for announced sizes, a bounded number of
// pending handshakes, each timed out, and no busy loop when file descriptors run out.
#include "dist_test_util.h"
#include "raw_peer.h"
#include "solo_member.h"

#include "dist/rpc/rpc_test_access.h"
#include "dist/transport/handshake.h"

#include <test_util.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::testing::RawPeer;
namespace wire = push::dist::detail::wire;
namespace hs = push::dist::detail::handshake;
using push::dist::detail::RpcTestAccess;

namespace {

using Group = push::testing::SoloMember;

std::vector<char> bytes_of(const hs::Bytes& b) { return std::vector<char>(b.begin(), b.end()); }

/// Resident memory of this process, in bytes.
int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      status >> kb;
      return kb * 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

}  // namespace

TEST(RpcTrust, OnlyAConnectionThatProvesTheGroupKeyGetsIn) {
  Group g;
  // The old predictable token (the group's store prefix) opens nothing.
  {
    RawPeer peer(g.port());
    const std::string token = "push/rpc/solo#0/";
    peer.write(RawPeer::frame(wire::kHello, 0, std::vector<char>(token.begin(), token.end())));
    peer.write(RawPeer::call_frame(1, "solo_answer", {}));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // A hello, then a call instead of the proof.
  {
    RawPeer peer(g.port());
    peer.write(hs::hello_frame(0, hs::random_bytes()));
    ASSERT_TRUE(peer.read_bytes(hs::kChallengeBytes, 10s));
    peer.write(RawPeer::call_frame(1, "solo_answer", {}));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // A proof made with another key; and a dialer with another key does not trust the member.
  hs::Bytes wrong = g.key();
  wrong[0] ^= 1;
  {
    RawPeer peer(g.port());
    const hs::Bytes mine = hs::random_bytes();
    peer.write(hs::hello_frame(0, mine));
    auto challenge = peer.read_bytes(hs::kChallengeBytes, 10s);
    ASSERT_TRUE(challenge);
    hs::Bytes theirs;
    std::memcpy(theirs.data(), challenge->data() + wire::kHeaderBytes, hs::kBytes);
    peer.write(hs::proof_frame(hs::proof(wrong, "dialer", mine, theirs, 0, 0, c10::str("127.0.0.1:", g.port()))));
    peer.write(RawPeer::call_frame(1, "solo_answer", {}));
    EXPECT_FALSE(peer.read_reply(2s));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  EXPECT_PUSH_ERROR(RawPeer(g.port(), wrong), "could not prove it belongs to this job");
  // A recorded handshake replayed on a new connection: the member's nonce is new, so the
  // recorded proof is wrong for it.
  std::vector<char> hello, proof;
  {
    RawPeer peer(g.port());
    const hs::Bytes mine = hs::random_bytes();
    hello = hs::hello_frame(0, mine);
    peer.write(hello);
    auto challenge = peer.read_bytes(hs::kChallengeBytes, 10s);
    ASSERT_TRUE(challenge);
    hs::Bytes theirs;
    std::memcpy(theirs.data(), challenge->data() + wire::kHeaderBytes, hs::kBytes);
    const std::string address = c10::str("127.0.0.1:", g.port());
    proof = hs::proof_frame(hs::proof(g.key(), "dialer", mine, theirs, 0, 0, address));
    peer.write(proof);
    peer.seal_with(hs::session_keys(g.key(), mine, theirs, 0, 0, address));
    peer.write(RawPeer::call_frame(1, "solo_answer", {}));
    ASSERT_TRUE(peer.read_reply(10s));  // the recording was of a good handshake
  }
  {
    RawPeer peer(g.port());
    peer.write(hello);
    ASSERT_TRUE(peer.read_bytes(hs::kChallengeBytes, 10s));
    peer.write(proof);
    peer.write(RawPeer::call_frame(1, "solo_answer", {}));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // A rank outside the group.
  {
    RawPeer peer(g.port());
    peer.write(hs::hello_frame(5, hs::random_bytes()));
    EXPECT_TRUE(peer.closed_within(10s));
  }
  EXPECT_TRUE(g.answers());
}

TEST(RpcTrust, GroupKeysAreDrawnPerJobNotDerivedFromNames) {
  // Same group name, same counters, same rank names: different jobs, different keys.
  Group a, b;
  EXPECT_NE(hs::to_hex(a.key()), hs::to_hex(b.key()));
  EXPECT_PUSH_ERROR(RawPeer(a.port(), b.key()), "could not prove it belongs to this job");
  // With a secret given to the job (PUSH_JOB_SECRET), the key follows from it and the prefix.
  const std::string secret(64, '7');
  push::dist::World w(push::dist::WorldOptions().master_port(push::dist::free_port()).job_secret(secret));
  auto rpc = w.rpc_group("solo", {w.name()});
  EXPECT_EQ(hs::to_hex(RpcTestAccess::key(rpc)),
            hs::to_hex(hs::group_key(hs::from_hex(secret, "secret"), "push/rpc/solo#0/")));
}

TEST(RpcTrust, HandshakeMacsMatchRfc4231) {
  // RFC 4231, test case 2 ("Jefe", "what do ya want for nothing?") needs a 4-byte key; our
  // keys are 32 bytes: test case 1's key is 20 bytes of 0x0b, zero-padded to 32 bytes gives
  // the same HMAC (keys shorter than the block are zero-padded by HMAC itself).
  hs::Bytes key{};
  std::fill(key.begin(), key.begin() + 20, 0x0b);
  EXPECT_EQ(hs::to_hex(hs::hmac(key, "Hi There")), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(RpcTrust, AnAnnouncedSizeCostsNoMemoryBeforeOrAfterTheHandshake) {
  Group g(push::dist::RpcGroupOptions().max_message_bytes(uint64_t{4} << 30));
  const int64_t before = resident_bytes();
  // Before the handshake: a hello announcing 4 GiB of meta (twice).
  for (int i = 0; i < 2; ++i) {
    RawPeer peer(g.port());
    std::vector<char> head(wire::kHeaderBytes);
    wire::Header h;
    h.type = wire::kHello;
    h.meta_bytes = 0xFFFFFF00u;
    wire::write_header(h, head.data());
    peer.write(head);
    EXPECT_TRUE(peer.closed_within(10s));
  }
  // After it: a call announcing 3 GiB of meta that sends 1 KiB of it.
  RawPeer member(g.port(), g.key());
  std::vector<char> head(wire::kHeaderBytes);
  wire::Header h;
  h.type = wire::kCall;
  h.id = 1;
  h.meta_bytes = 3u << 30;
  wire::write_header(h, head.data());
  head.insert(head.end(), 1024, 'x');
  ASSERT_TRUE(member.write(head));
  EXPECT_FALSE(member.read_reply(500ms));
  const int64_t grown = resident_bytes() - before;
  EXPECT_LT(grown, int64_t{64} << 20) << "resident memory grew by " << grown << " bytes";
  EXPECT_TRUE(g.answers());
}

TEST(RpcTrust, PendingHandshakesAreBoundedAndTimedOut) {
  Group g(push::dist::RpcGroupOptions().handshake_timeout(1500ms));
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(std::make_unique<RawPeer>(g.port()));
  // At most 64 wait at once: the 36 oldest are closed to make room, the newest stay.
  for (int i = 0; i < 36; ++i) EXPECT_TRUE(idle[i]->closed_within(5s)) << "connection " << i;
  EXPECT_FALSE(idle[99]->closed_within(200ms));
  // A member still gets in (its connection makes room too), and at the timeout the
  // strangers are gone.
  EXPECT_TRUE(g.answers());
  for (int i = 36; i < 100; ++i) EXPECT_TRUE(idle[i]->closed_within(5s)) << "connection " << i;
  EXPECT_TRUE(g.answers());
}

TEST(RpcTrust, OutOfFileDescriptorsTheIoThreadWaitsInsteadOfSpinning) {
  Group g;
  rlimit saved{};
  ::getrlimit(RLIMIT_NOFILE, &saved);
  std::vector<std::unique_ptr<RawPeer>> flood;
  {
    // Leave this process 48 descriptors to spare, then take them all with connections to
    // the member (each costs one here and one in the member when accepted).
    int open = 0;
    for (int fd = 0; fd < 65536; ++fd) open += ::fcntl(fd, F_GETFD) != -1 ? 1 : 0;
    rlimit low = saved;
    low.rlim_cur = static_cast<rlim_t>(open + 48);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    for (;;) {
      try {
        flood.push_back(std::make_unique<RawPeer>(g.port()));
      } catch (const push::Error&) {
        break;  // no descriptor left for one more
      }
    }
  }
  // Once the connections it could take are accepted.
  const double used = push::testing::cpu_seconds_over_an_idle_second();
  EXPECT_LT(used, 0.3) << "CPU seconds used in one idle second with no descriptors left";
  flood.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(push::testing::eventually([&] { return g.answers(); }, 10s));
}
