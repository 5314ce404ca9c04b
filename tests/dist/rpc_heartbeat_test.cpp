// A member that is alive but stopped (SIGSTOP) sends no heartbeats: every other member
// finds it lost within heartbeat_timeout (and a quarter), with the failure path of a member
// that died, and the others go on.
#include "dist_test_util.h"

#include <test_util.h>

#include <signal.h>
#include <unistd.h>

#include <thread>
#include <vector>

using namespace std::chrono_literals;
using push::dist::RpcArgs;

namespace {

c10::IValue beat_whoami(const RpcArgs&) { return c10::IValue(int64_t{::getpid()}); }
PUSH_RPC_FUNCTION(beat_whoami);

}  // namespace

PUSH_DIST_WORKER(rpc_stopped_member) {
  // 1 s; 4 s in a sanitizer build, whose loaded members can go a second without a word
  // (seen under TSan: a live member taken for silent).
  const std::chrono::milliseconds beat = push::testing::sanitized() ? 4s : 1s;
  auto world = push::dist::World(push::dist::WorldOptions::from_env().timeout(5s).shutdown_timeout(3s));
  auto rpc =
      world.rpc_group("beats", world.names(), push::dist::RpcGroupOptions().heartbeat_timeout(beat).timeout(60s));
  const int rank = world.rank();
  rpc.barrier(30s);
  if (rank == 2) {
    const std::string me = std::to_string(::getpid());
    world.store().set("test/pid", std::vector<uint8_t>(me.begin(), me.end()));
    ::raise(SIGSTOP);  // rank 0 kills it
    return;
  }
  const auto bytes = world.store().get("test/pid");
  const pid_t pid = std::stoi(std::string(bytes.begin(), bytes.end()));
  ASSERT_TRUE(push::testing::eventually([&] { return push::testing::is_stopped(pid); }, 10s));
  if (rank == 0) {
    // A call to the stopped member with a 60 s timeout fails when its silence passes `beat`.
    const auto start = std::chrono::steady_clock::now();
    EXPECT_PUSH_ERROR(rpc.rpc_sync(2, "beat_whoami", {}),
                      "nothing heard from it for " + std::to_string(beat.count()) + " ms (heartbeat_timeout)");
    EXPECT_LT(std::chrono::steady_clock::now() - start, beat * 5);
  }
  // Every member finds it lost, and the others go on.
  EXPECT_TRUE(push::testing::eventually([&] { return rpc.lost_members() == std::vector<int>{2}; }, 10s));
  for (int i = 0; i < 20; ++i) EXPECT_NE(rpc.rpc_sync(1 - rank, "beat_whoami", {}).toInt(), 0);
  // Both live members are done with rank 2 (a store count: the group's barrier would wait for it).
  world.store().add("test/done", 1);
  ASSERT_TRUE(push::testing::eventually([&] { return world.store().add("test/done", 0) == 2; }, 30s));
  if (rank == 0) ::kill(pid, SIGKILL);
  push::testing::shutdown_quietly(rpc);
}

TEST(DistFailure, AStoppedMemberIsLostWithinTheHeartbeatTimeout) {
  auto codes = push::testing::run_workers(3, "rpc_stopped_member", 90s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

// A member that joins the group late (longer than heartbeat_timeout) is not taken for
// silent by those that dialed it early, nor does it take them for silent.
PUSH_DIST_WORKER(rpc_late_member) {
  auto world = push::testing::test_world();
  // Real time is the point: the others' heartbeat clocks run in their own processes.
  if (world.rank() == 1) std::this_thread::sleep_for(2s);
  auto rpc = world.rpc_group("late", world.names(), push::dist::RpcGroupOptions().heartbeat_timeout(500ms));
  for (int peer = 0; peer < world.size(); ++peer) EXPECT_NE(rpc.rpc_sync(peer, "beat_whoami", {}).toInt(), 0);
  EXPECT_TRUE(rpc.lost_members().empty());
  rpc.barrier(30s);
}

TEST(DistFailure, AMemberThatJoinsLateIsNotTakenForSilent) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "rpc_late_member", 60s));
}
