// The RPC wire format and what a member does with frames that break it: values of every
// supported kind survive the trip, malformed frames fail their call or close their
// connection (never the member), and 10,000 random and mutated frames neither crash nor
// hang a member nor stop it answering.
#include "dist_test_util.h"
#include "raw_peer.h"
#include "solo_member.h"

#include "dist/transport/shm_ring.h"

#include <test_util.h>

#include <cstring>
#include <random>

#include <unistd.h>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::testing::RawPeer;
using push::testing::SoloMember;
namespace wire = push::dist::detail::wire;
using push::dist::detail::SendRing;

namespace {

c10::IValue wire_echo(const RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(wire_echo);

c10::IValue round_trip(const c10::IValue& v) { return wire::copy_value(v); }

}  // namespace

TEST(RpcWire, EveryValueKindSurvivesTheTrip) {
  auto t = torch::arange(12.0).reshape({3, 4});
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  d.insert("w", torch::ones({2}, torch::kInt32));
  c10::List<int64_t> ints({1, 2, 3});
  auto v = c10::ivalue::Tuple::create({c10::IValue(), c10::IValue(true), c10::IValue(int64_t{-5}), c10::IValue(2.5),
                                       c10::IValue(c10::complex<double>(1, -2)), c10::IValue(std::string("text")),
                                       c10::IValue(t.t()), c10::IValue(t.slice(1, 1, 3)), c10::IValue(at::Tensor()),
                                       c10::IValue(ints), c10::IValue(d), c10::IValue(torch::zeros({0, 3})),
                                       c10::IValue(torch::tensor({true, false})),
                                       c10::IValue(torch::ones({2}, torch::kBFloat16))});
  auto back = round_trip(v).toTupleRef().elements();
  ASSERT_EQ(back.size(), 14u);
  EXPECT_TRUE(back[0].isNone());
  EXPECT_EQ(back[1].toBool(), true);
  EXPECT_EQ(back[2].toInt(), -5);
  EXPECT_EQ(back[3].toDouble(), 2.5);
  EXPECT_EQ(back[4].toComplexDouble(), c10::complex<double>(1, -2));
  EXPECT_EQ(back[5].toStringRef(), "text");
  EXPECT_TRUE(torch::equal(back[6].toTensor(), t.t()));  // a transposed view arrives dense
  EXPECT_TRUE(back[6].toTensor().is_contiguous());
  EXPECT_TRUE(torch::equal(back[7].toTensor(), t.slice(1, 1, 3)));
  EXPECT_FALSE(back[8].toTensor().defined());
  EXPECT_TRUE(back[9].isIntList());
  EXPECT_EQ(back[9].toIntVector(), std::vector<int64_t>({1, 2, 3}));
  auto dict = back[10].toGenericDict();
  EXPECT_TRUE(torch::equal(dict.at("w").toTensor(), torch::ones({2}, torch::kInt32)));
  EXPECT_EQ(back[11].toTensor().sizes(), torch::IntArrayRef({0, 3}));
  EXPECT_EQ(back[12].toTensor().scalar_type(), torch::kBool);
  EXPECT_EQ(back[13].toTensor().scalar_type(), torch::kBFloat16);
  // The copy owns its bytes, and two values sharing storage arrive as two tensors.
  EXPECT_NE(back[6].toTensor().data_ptr(), t.data_ptr());
  auto twice = round_trip(c10::ivalue::Tuple::create({c10::IValue(t), c10::IValue(t)})).toTupleRef().elements();
  EXPECT_TRUE(torch::equal(twice[0].toTensor(), twice[1].toTensor()));
  EXPECT_NE(twice[0].toTensor().data_ptr(), twice[1].toTensor().data_ptr());
}

TEST(RpcWire, UnsupportedValuesAreRefusedByName) {
  EXPECT_PUSH_ERROR(round_trip(c10::IValue(c10::Device(c10::kCPU))), "cannot send a value of type Device");
  EXPECT_PUSH_ERROR(round_trip(c10::IValue(torch::ones({2, 2}).to_sparse())), "only dense tensors");
  c10::IValue deep(int64_t{1});
  for (int i = 0; i < wire::kMaxDepth + 1; ++i) deep = c10::ivalue::Tuple::create({deep});
  EXPECT_PUSH_ERROR(round_trip(deep), "nested deeper than");
}

TEST(RpcWire, MalformedFramesFailTheirCallOrCloseTheirConnection) {
  SoloMember solo(push::dist::RpcGroupOptions().max_message_bytes(uint64_t{1} << 20));
  // A frame that is well formed but whose value is not a call fails that call only.
  {
    RawPeer peer(solo.port(), solo.key());
    auto seven = wire::encode(c10::IValue(int64_t{7}));
    ASSERT_TRUE(peer.write(RawPeer::frame(wire::kCall, 1, seven.meta)));
    auto reply = peer.read_reply(10s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->header.type, wire::kReplyError);
    EXPECT_EQ(reply->header.id, 1u);
    EXPECT_NE(reply->value.toStringRef().find("expected (name, (args...))"), std::string::npos);
    // A value cut short: its bytes are consumed, its call fails, the connection goes on.
    auto good = RawPeer::call_frame(2, "solo_answer", {});
    std::vector<char> meta(good.begin() + wire::kHeaderBytes, good.end());
    meta.resize(meta.size() - 3);
    ASSERT_TRUE(peer.write(RawPeer::frame(wire::kCall, 2, meta)));
    reply = peer.read_reply(10s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->header.type, wire::kReplyError);
    EXPECT_NE(reply->value.toStringRef().find("malformed message"), std::string::npos);
    // A tensor table that disagrees with the data bytes announced: the data is skipped.
    auto table = wire::encode(c10::ivalue::Tuple::create(
        {c10::IValue(std::string("wire_echo")), c10::ivalue::Tuple::create({torch::ones({4})})}));
    ASSERT_TRUE(peer.write(RawPeer::frame(wire::kCall, 3, table.meta, 1, std::vector<char>(8, 0))));
    reply = peer.read_reply(10s);
    ASSERT_TRUE(reply);
    EXPECT_NE(reply->value.toStringRef().find("malformed message"), std::string::npos);
    EXPECT_NE(reply->value.toStringRef().find("8 data bytes announced"), std::string::npos);
    ASSERT_TRUE(peer.write(RawPeer::call_frame(4, "wire_echo", {torch::full({3}, 2.0)})));
    reply = peer.read_reply(10s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->header.type, wire::kReplyOk);
    EXPECT_TRUE(torch::equal(reply->value.toTensor(), torch::full({3}, 2.0)));
  }
  // Frames the stream cannot recover from close that connection, and only it.
  auto closes = [&](bool introduced, std::vector<char> bytes) {
    auto peer =
        introduced ? std::make_unique<RawPeer>(solo.port(), solo.key()) : std::make_unique<RawPeer>(solo.port());
    peer->write(bytes);
    return peer->closed_within(10s);
  };
  auto bad_magic = RawPeer::call_frame(1, "solo_answer", {});
  bad_magic[0] ^= 0x5a;
  EXPECT_TRUE(closes(true, bad_magic));
  EXPECT_TRUE(closes(true, RawPeer::frame(99, 1, {'x'})));              // unknown type
  EXPECT_TRUE(closes(true, RawPeer::frame(wire::kReplyOk, 1, {'x'})));  // a reply as a request
  EXPECT_TRUE(
      closes(true, RawPeer::frame(wire::kCall, 1, {}, 0, std::vector<char>(uint64_t{2} << 20))));  // over the limit
  EXPECT_TRUE(closes(false, RawPeer::call_frame(1, "solo_answer", {})));                           // no handshake first
  const push::dist::detail::handshake::Bytes nonce{};
  EXPECT_TRUE(closes(true, push::dist::detail::handshake::hello_frame(0, nonce)));  // a second hello
  EXPECT_TRUE(solo.answers());
  EXPECT_EQ(solo.rpc.rpc_sync(solo.world.name(), "solo_answer").toInt(), 42);
}

namespace {
/// A kRing frame announcing a ring of this process.
std::vector<char> ring_frame(int64_t fd, uint64_t slot_bytes, uint64_t slots) {
  std::vector<char> meta;
  for (uint64_t v : {static_cast<uint64_t>(::getpid()), static_cast<uint64_t>(fd), slot_bytes, slots}) {
    const auto* p = reinterpret_cast<const char*>(&v);
    meta.insert(meta.end(), p, p + sizeof(v));
  }
  return RawPeer::frame(wire::kRing, 0, meta);
}

/// `frame` (a call with tensor data) split in two: its header (flagged kRingData) and
/// meta, which go on the stream, and its data bytes, which go through a ring.
std::pair<std::vector<char>, std::vector<char>> ring_call(std::vector<char> frame) {
  const auto h = wire::read_header(frame.data(), uint64_t{1} << 30);
  const uint16_t flags = h.flags | wire::kRingData;
  std::memcpy(frame.data() + 6, &flags, sizeof(flags));
  const auto head = wire::kHeaderBytes + h.meta_bytes;
  return {std::vector<char>(frame.begin(), frame.begin() + static_cast<std::ptrdiff_t>(head)),
          std::vector<char>(frame.begin() + static_cast<std::ptrdiff_t>(head), frame.end())};
}

std::vector<char> note(uint64_t bytes) {
  const auto* p = reinterpret_cast<const char*>(&bytes);
  return std::vector<char>(p, p + sizeof(bytes));
}
}  // namespace

TEST(RpcWire, RingsAreCheckedBeforeTheyAreMappedAndTheirDataArrives) {
  SoloMember solo(push::dist::RpcGroupOptions().max_message_bytes(uint64_t{1} << 20));
  constexpr uint64_t kSlot = 64 << 10;
  std::string why;
  auto ring = SendRing::create(kSlot, 2, why);
  ASSERT_TRUE(ring) << why;
  // A call whose 300 KiB of data go through a 2-slot ring: the member empties each slot
  // for the next one.
  {
    RawPeer peer(solo.port(), solo.key());
    const auto x = torch::arange(75 * 1024, torch::kFloat);
    auto [head, data] = ring_call(RawPeer::call_frame(9, "wire_echo", {x}));
    ASSERT_TRUE(peer.write(ring_frame(ring->fd(), kSlot, 2)));
    ASSERT_TRUE(peer.write(head));
    std::atomic<bool> broken{false};
    for (std::size_t done = 0; done < data.size();) {
      char* slot = ring->acquire(std::chrono::steady_clock::now() + 10s, broken, "the member");
      const auto n = std::min<std::size_t>(kSlot, data.size() - done);
      std::memcpy(slot, data.data() + done, n);
      ring->publish();
      ASSERT_TRUE(peer.write(note(n)));
      done += n;
    }
    auto reply = peer.read_reply(10s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->header.type, wire::kReplyOk);
    EXPECT_TRUE(torch::equal(reply->value.toTensor(), x));
  }
  auto closes = [&](std::vector<std::vector<char>> frames) {
    RawPeer peer(solo.port(), solo.key());
    for (const auto& f : frames) peer.write(f);
    return peer.closed_within(10s);
  };
  auto [head, data] = ring_call(RawPeer::call_frame(1, "wire_echo", {torch::ones({1024})}));
  EXPECT_TRUE(closes({head, note(4096)}));                                      // ring data, no ring
  EXPECT_TRUE(closes({RawPeer::frame(wire::kRing, 0, std::vector<char>(8))}));  // a short announcement
  EXPECT_TRUE(closes({ring_frame(0, kSlot, 2)}));                               // not a ring: this process's stdin
  EXPECT_TRUE(closes({ring_frame(ring->fd(), kSlot, 3)}));                      // not the announced size
  EXPECT_TRUE(closes({ring_frame(ring->fd(), kSlot, 2), ring_frame(ring->fd(), kSlot, 2)}));  // a second ring
  EXPECT_TRUE(closes({ring_frame(ring->fd(), kSlot, 2), head, note(100)}));  // a note of the wrong size
  EXPECT_TRUE(solo.answers());
}

TEST(RpcWire, TenThousandRandomAndMutatedFramesNeitherCrashNorHangAMember) {
  SoloMember solo(push::dist::RpcGroupOptions().max_message_bytes(uint64_t{1} << 16));
  std::mt19937_64 rng(20261123);
  const std::vector<std::vector<char>> seeds = {
      RawPeer::call_frame(1, "solo_answer", {}),
      RawPeer::call_frame(2, "wire_echo", {torch::arange(6.0).reshape({2, 3})}),
      RawPeer::call_frame(3, "wire_echo",
                          {c10::ivalue::Tuple::create({c10::IValue(std::string("a")), c10::IValue(1.5)})}),
      RawPeer::call_frame(4, "no_such_function", {c10::IValue(int64_t{3})}, wire::kRemoteCall),
      RawPeer::frame(wire::kFetchRRef, 5, wire::encode(c10::IValue(int64_t{0})).meta),
      RawPeer::frame(wire::kFetchPaired, 6, wire::encode(c10::IValue(std::string("k"))).meta),
  };
  auto mutate = [&](std::vector<char> f) {
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {  // flip bytes anywhere, header included
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i)
        f[rng() % f.size()] ^= static_cast<char>(1 + rng() % 255);
    } else if (kind == 1) {  // flip bytes past the header: the frame stays in step, its value breaks
      if (f.size() > wire::kHeaderBytes) {
        for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) {
          f[wire::kHeaderBytes + rng() % (f.size() - wire::kHeaderBytes)] ^= static_cast<char>(1 + rng() % 255);
        }
      }
    } else if (kind == 2) {  // truncate
      f.resize(rng() % f.size());
    } else {  // random bytes behind a plausible header
      f.resize(wire::kHeaderBytes + rng() % 200);
      for (std::size_t i = 16; i < f.size(); ++i) f[i] = static_cast<char>(rng());
    }
    return f;
  };
  int sent = 0;
  while (sent < 10000) {
    auto introduced = rng() % 8 != 0;
    auto owned =
        introduced ? std::make_unique<RawPeer>(solo.port(), solo.key()) : std::make_unique<RawPeer>(solo.port());
    RawPeer& peer = *owned;
    for (int i = 0; i < 20 && sent < 10000; ++i, ++sent) {
      std::vector<char> f;
      if (rng() % 5 == 0) {
        f.resize(1 + rng() % 128);
        for (auto& c : f) c = static_cast<char>(rng());
      } else {
        f = mutate(seeds[rng() % seeds.size()]);
      }
      if (!peer.write(f)) break;
    }
    if (sent % 1000 < 20) ASSERT_TRUE(solo.answers()) << "after " << sent << " frames";
  }
  EXPECT_TRUE(solo.answers());
  EXPECT_EQ(solo.rpc.rpc_sync(solo.world.name(), "wire_echo", {torch::ones({2})}).toTensor().sum().item<double>(), 2.0);
}
