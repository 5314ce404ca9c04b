// push across the test bed's hosts (netbed.h): particles with messages, views and
// checkpoints, the RPC layer, a parameter server, DataParallel, DASO and SyncBatchNorm, each
// by the worker body its one-host test runs (ranks_on_hosts.h), now with one rank per host.
// Between hosts nothing goes through shared memory: what ranks send crosses the link.
#include <push/dist.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <test_util.h>

#include "runtime/scratch_dir.h"

#include "netbed/netbed_util.h"
#include "netbed/ranks_on_hosts.h"

using namespace std::chrono_literals;

namespace {
using namespace push::testing;

using CrossHost = Hosts;

c10::IValue netbed_echo(const push::dist::RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(netbed_echo);

// 32 MiB each way between two ranks: unchanged, through the network between two hosts
// (no ring, though the ranks share a machine) and through shared memory between two ranks
// of one host (PUSH_TEST_SAME_HOST: the control, that rings still form where they should).
PUSH_DIST_WORKER(netbed_large_values) {
  auto world = test_world(60s);
  auto rpc = world.rpc_group("large", world.names());
  const auto value = torch::arange(8 << 20, torch::kFloat32);
  EXPECT_TRUE(torch::equal(rpc.rpc_sync(1 - world.rank(), "netbed_echo", {value}).toTensor(), value));
  if (std::getenv("PUSH_TEST_SAME_HOST")) {
    EXPECT_GE(rings_here(), 1);
  } else {
    EXPECT_EQ(rings_here(), 0);
  }
  rpc.shutdown();
}

TEST_F(CrossHost, LargeValuesCrossTheLinkNotSharedMemory) {
  NetBed bed(2);
  expect_all_ok(run_workers(2, "netbed_large_values", 90s, {}, on_hosts(bed, {0, 1})));
  expect_all_ok(run_workers(2, "netbed_large_values", 90s, {"PUSH_TEST_SAME_HOST=1"}, on_hosts(bed, {0, 0})));
}

TEST_F(CrossHost, ParticleMessagesChainsCyclesViewsAndErrorsAcrossThreeHosts) {
  NetBed bed(3);
  expect_all_ok(
      run_workers(3, "ranks_messages", 120s, {"PUSH_TEST_LANES=1"}, on_hosts(bed, {0, 1, 2}, PUSH_RANKS_TESTS)));
}

TEST_F(CrossHost, ParticleMessagesOverA2MsLinkGiveTheSameResults) {
  NetBed bed(2);
  for (int h = 0; h < 2; ++h) bed.link(h, LinkSpec{.delay_ms = 1});
  expect_all_ok(run_workers(2, "ranks_messages", 120s, {"PUSH_TEST_LANES=2"}, on_hosts(bed, {0, 1}, PUSH_RANKS_TESTS)));
}

TEST_F(CrossHost, ViewsOfParticlesOnAnotherHostAreCachedUntilTheyRun) {
  NetBed bed(2);
  expect_all_ok(run_workers(2, "ranks_views", 120s, {}, on_hosts(bed, {0, 1}, PUSH_RANKS_TESTS)));
}

TEST_F(CrossHost, SavedOnTwoHostsLoadsOnThree) {
  // The hosts share this machine's file system, as a cluster's hosts share one.
  const auto dir = fresh_dir("netbed", "ckpt") / "ckpt";
  const std::string env = "PUSH_TEST_DIR=" + dir.string();
  NetBed bed(3);
  expect_all_ok(run_workers(2, "ranks_save", 120s, {env}, on_hosts(bed, {0, 1}, PUSH_RANKS_TESTS)));
  ASSERT_TRUE(std::filesystem::exists(dir / "push.manifest"));
  expect_all_ok(
      run_workers(3, "ranks_load", 120s, {env, "PUSH_TEST_MODE=new"}, on_hosts(bed, {0, 1, 2}, PUSH_RANKS_TESTS)));
}

TEST_F(CrossHost, RpcCallsServicesAndMembershipAcrossThreeHosts) {
  NetBed bed(3);
  expect_all_ok(run_workers(3, "rpc_calls", 90s, {}, on_hosts(bed, {0, 1, 2}, PUSH_DIST_TESTS)));
  expect_all_ok(run_workers(3, "rpc_services", 90s, {}, on_hosts(bed, {0, 1, 2}, PUSH_DIST_TESTS)));
}

TEST_F(CrossHost, AParameterServerWithItsWorkersOnOtherHosts) {
  NetBed bed(3);
  expect_all_ok(run_workers(3, "grad_mean", 120s, {}, on_hosts(bed, {0, 1, 2}, PUSH_SERVER_TESTS)));
}

TEST_F(CrossHost, DataParallelAndDasoOverTwoHostsOfTwoRanks) {
  NetBed bed(2);
  expect_all_ok(run_workers(4, "data_parallel", 120s, {}, on_hosts(bed, {0, 0, 1, 1}, PUSH_DATA_PARALLEL_TESTS)));
  expect_all_ok(run_workers(4, "daso", 180s, {}, on_hosts(bed, {0, 0, 1, 1}, PUSH_DATA_PARALLEL_TESTS)));
}

TEST_F(CrossHost, SyncBatchNormAcrossTwoHosts) {
  NetBed bed(2);
  expect_all_ok(run_workers(2, "sync_batch_norm", 120s, {}, on_hosts(bed, {0, 1}, PUSH_DATA_PARALLEL_TESTS)));
}

}  // namespace
