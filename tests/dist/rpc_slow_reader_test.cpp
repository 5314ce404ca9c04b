// A member that stops reading (SIGSTOP) after asking for large replies holds up nobody
// else: the replies wait for it without holding the handler loop, so other members' calls
// on that loop are answered at once. One stopped for longer than the send timeout loses
// its connection (its calls fail), and once it runs again it calls and is called as before.
#include "dist_test_util.h"

#include <test_util.h>

#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using push::dist::RpcArgs;

namespace {

c10::IValue slow_whoami(const RpcArgs&) { return c10::IValue(int64_t{::getpid()}); }
PUSH_RPC_FUNCTION(slow_whoami);

c10::IValue slow_big(const RpcArgs&) { return torch::ones({8 << 20}); }  // 32 MiB
PUSH_RPC_FUNCTION(slow_big);

void publish_pid(push::dist::World& world) {
  const std::string me = std::to_string(::getpid());
  world.store().set("test/pid", std::vector<uint8_t>(me.begin(), me.end()));
}

pid_t published_pid(push::dist::World& world) {
  const auto bytes = world.store().get("test/pid");
  return std::stoi(std::string(bytes.begin(), bytes.end()));
}

// Rank 1 asks rank 0 for 8 × 32 MiB and stops. Rank 0 has one handler loop and the default
// 30 s heartbeat: rank 2's small calls to it must not wait behind the stuck replies.
void stopped_reader(bool shared_memory) {
  auto world = push::dist::World(push::dist::WorldOptions::from_env().timeout(5s).shutdown_timeout(3s));
  auto rpc =
      world.rpc_group("reader", world.names(),
                      push::dist::RpcGroupOptions().timeout(60s).handler_threads(1).shared_memory(shared_memory));
  const int rank = world.rank();
  rpc.barrier(30s);
  if (rank == 1) {
    publish_pid(world);
    std::vector<push::Future<c10::IValue>> big;
    for (int i = 0; i < 8; ++i) big.push_back(rpc.rpc_async(0, "slow_big", {}));
    ::raise(SIGSTOP);  // rank 0 kills it
    return;
  }
  const pid_t pid = published_pid(world);
  if (rank == 2) {
    ASSERT_TRUE(push::testing::eventually([&] { return push::testing::is_stopped(pid); }, 10s));
    // Real time, another process: rank 0's replies to the stopped rank 1 are stuck by now.
    std::this_thread::sleep_for(300ms);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) EXPECT_NE(rpc.rpc_sync(0, "slow_whoami", {}).toInt(), 0);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    world.store().set("test/echoed", {1});
  } else {
    world.store().wait({"test/echoed"}, 90s);
    ::kill(pid, SIGKILL);
  }
  push::testing::shutdown_quietly(rpc);
}

PUSH_DIST_WORKER(rpc_stopped_reader_socket) { stopped_reader(false); }
PUSH_DIST_WORKER(rpc_stopped_reader_ring) { stopped_reader(true); }

}  // namespace

TEST(DistFailure, AStoppedReaderDoesNotHoldUpOtherMembersCallsOnTheSameLoop) {
  auto codes = push::testing::run_workers(3, "rpc_stopped_reader_socket", 120s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}

TEST(DistFailure, AStoppedReaderOnItsSharedMemoryRingDoesNotHoldUpOtherMembersCalls) {
  auto codes = push::testing::run_workers(3, "rpc_stopped_reader_ring", 120s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}

namespace {

// Rank 1 asks for 4 × 32 MiB and is stopped for 4 s, twice the group's 2 s timeout (the
// send timeout), with heartbeats off: rank 0 gives up writing and drops the connection.
// Through shared memory: a stopped process empties no slot, whereas its kernel may go on
// taking a trickle of socket bytes (each one progress that restarts the send timeout).
// Once rank 1 runs again its calls have failed, and both members go on calling each other:
// neither lists the other as lost.
PUSH_DIST_WORKER(rpc_dropped_reader) {
  auto world = push::dist::World(push::dist::WorldOptions::from_env().timeout(10s).shutdown_timeout(5s));
  auto rpc =
      world.rpc_group("dropped", world.names(), push::dist::RpcGroupOptions().timeout(2s).heartbeat_timeout(0ms));
  rpc.barrier(30s);
  if (world.rank() == 1) {
    publish_pid(world);
    std::vector<push::Future<c10::IValue>> big;
    for (int i = 0; i < 4; ++i) big.push_back(rpc.rpc_async(0, "slow_big", {}, 60s));
    ::raise(SIGSTOP);  // rank 0 resumes it
    int failed = 0;
    for (auto& f : big) {
      try {
        f.wait();
      } catch (const push::Error& e) {
        EXPECT_NE(std::string(e.what()).find("lost the connection"), std::string::npos) << e.what();
        ++failed;
      }
    }
    EXPECT_GT(failed, 0);
  } else {
    const pid_t pid = published_pid(world);
    ASSERT_TRUE(push::testing::eventually([&] { return push::testing::is_stopped(pid); }, 10s));
    std::this_thread::sleep_for(4s);  // real time is the point: stopped past rank 0's send timeout
    ::kill(pid, SIGCONT);
  }
  world.store().add("test/resumed", 1);
  ASSERT_TRUE(push::testing::eventually([&] { return world.store().add("test/resumed", 0) == 2; }, 30s));
  const int other = 1 - world.rank();
  for (int i = 0; i < 5; ++i) EXPECT_NE(rpc.rpc_sync(other, "slow_whoami", {}).toInt(), 0);
  EXPECT_TRUE(rpc.lost_members().empty());
  rpc.barrier(30s);
  rpc.shutdown();
}

}  // namespace

TEST(DistFailure, AReaderDroppedForNotReadingCallsAndIsCalledAgainOnceItRuns) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "rpc_dropped_reader", 90s));
}
