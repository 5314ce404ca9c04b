// A member waiting for a reply looks for it without sleeping for at most
// RpcGroupOptions::reply_spin, and only while replies from that member come that fast
// (round_trips.h): a caller of a slow handler soon sleeps through its waits, burning
// nothing; the windows follow each member's own round trips; 0 turns them off.
#include "core/event_loop.h"
#include "dist/rpc/round_trips.h"
#include "dist/rpc/rpc_test_access.h"
#include "dist_test_util.h"

#include <test_util.h>

#include <thread>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::dist::detail::RoundTrips;

namespace {

c10::IValue spin_echo(const RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(spin_echo);

// Real time is the point: a round trip this slow turns the caller's window off, and the CPU
// the caller spends over it is measured.
c10::IValue spin_slow(const RpcArgs& a) {
  std::this_thread::sleep_for(std::chrono::milliseconds(a.at(0).toInt()));
  return a.at(0);
}
PUSH_RPC_FUNCTION(spin_slow);

}  // namespace

TEST(RoundTrips, WindowsFollowEachMembersRoundTripUpToTheLimit) {
  RoundTrips trips(3, 200us);
  // Nothing measured yet: the whole limit.
  EXPECT_EQ(trips.window(1), 200us);
  // Fast replies from member 1: twice its round trip.
  for (int i = 0; i < 100; ++i) trips.record(1, 30us);
  EXPECT_GE(trips.window(1), 60us);
  EXPECT_LE(trips.window(1), 64us);
  // Slow replies from member 2: none, and member 1's window is its own.
  for (int i = 0; i < 100; ++i) trips.record(2, 50ms);
  EXPECT_EQ(trips.window(2), 0ns);
  EXPECT_LE(trips.window(1), 64us);
  // One slow call among fast ones does not turn the window off.
  trips.record(1, 10s);
  EXPECT_GT(trips.window(1), 0ns);
  // Members that turn fast again get their window back.
  for (int i = 0; i < 100; ++i) trips.record(2, 20us);
  EXPECT_GT(trips.window(2), 0ns);
  // Unknown members, and a limit of 0, get none.
  EXPECT_EQ(trips.window(7), 0ns);
  EXPECT_EQ(trips.window(-1), 0ns);
  RoundTrips off(2, 0us);
  off.record(1, 10us);
  EXPECT_EQ(off.window(1), 0ns);
}

TEST(DistRpc, ANegativeReplySpinIsRefusedByName) {
  push::dist::World world(push::dist::WorldOptions().master_port(push::dist::free_port()).init_timeout(30s));
  EXPECT_PUSH_ERROR(world.rpc_group("spin", {world.name()}, push::dist::RpcGroupOptions().reply_spin(-1us)),
                    "reply_spin must be between 0 (sleep at once) and 1 s");
  EXPECT_PUSH_ERROR(world.rpc_group("spin", {world.name()}, push::dist::RpcGroupOptions().reply_spin(2s)),
                    "reply_spin must be between 0 (sleep at once) and 1 s");
}

PUSH_DIST_WORKER(rpc_reply_spin) {
  auto world = push::dist::World(push::dist::WorldOptions::from_env().timeout(60s));
  // A 5 ms limit, so that a caller that kept looking through its waits would show.
  auto rpc = world.rpc_group("spin", world.names(), push::dist::RpcGroupOptions().reply_spin(5ms));
  auto off = world.rpc_group("spin_off", world.names(), push::dist::RpcGroupOptions().reply_spin(0us));
  if (world.rank() == 0) {
    using push::dist::detail::RpcTestAccess;
    for (int64_t i = 0; i < 200; ++i) {
      EXPECT_EQ(rpc.rpc_sync(1, "spin_echo", {c10::IValue(i)}).toInt(), i);
      EXPECT_EQ(off.rpc_sync(1, "spin_echo", {c10::IValue(i)}).toInt(), i);
    }
    // Fast replies: calls look for them, for twice their round trip; never with 0, never to oneself.
    EXPECT_GT(RpcTestAccess::reply_window(rpc, 1), 0ns);
    EXPECT_LE(RpcTestAccess::reply_window(rpc, 1), 5ms);
    EXPECT_EQ(RpcTestAccess::reply_window(off, 1), 0ns);
    // 20 calls of a 20 ms handler: at most the first few look for their reply (5 ms each)
    // before the round trips seen turn the window off; looking through every wait would
    // burn 20 x 5 ms = 100 ms more CPU than the same calls with the windows off.
    auto cpu_of_slow_calls = [&](push::dist::RpcGroup& group) {
      const auto cpu = push::testing::thread_cpu();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) EXPECT_EQ(group.rpc_sync(1, "spin_slow", {c10::IValue(int64_t{20})}).toInt(), 20);
      EXPECT_GE(std::chrono::steady_clock::now() - start, 400ms);
      return push::testing::thread_cpu() - cpu;
    };
    const auto looking = cpu_of_slow_calls(rpc);
    const auto sleeping = cpu_of_slow_calls(off);
    EXPECT_EQ(RpcTestAccess::reply_window(rpc, 1), 0ns);  // the slow calls turned it off
    EXPECT_LT(looking - sleeping, 50ms) << "looking for slow replies cost "
                                        << std::chrono::duration<double, std::milli>(looking - sleeping).count()
                                        << " ms of CPU more than sleeping through them";
    // From a fiber too: fast calls return their values.
    auto loop = std::make_shared<push::detail::EventLoop>(push::detail::EventLoop::Options{.name = "spin-fiber"});
    loop->start();
    push::Promise<int64_t> sum;
    loop->post_fiber(
        [&] {
          int64_t s = 0;
          for (int64_t i = 0; i < 100; ++i) s += rpc.rpc_sync(1, "spin_echo", {c10::IValue(i)}).toInt();
          sum.set_value(s);
        },
        [&](std::exception_ptr e) { sum.set_error(e); });
    EXPECT_EQ(sum.future().wait(), 4950);
    loop->stop();
  }
  push::testing::shutdown_quietly(off);
  push::testing::shutdown_quietly(rpc);
}

TEST(DistRpc, ACallerOfASlowMemberSleepsThroughItsWaits) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "rpc_reply_spin", 120s));
}
