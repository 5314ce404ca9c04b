// A program of one's own whose ranks share only collectives (Gloo, no RPC group), over two
// hosts of the test bed (netbed.h): when host 1 is killed, what rank 0 on host 0 sees and
// how long it takes to end. No RPC group means no heartbeats and no lost-member list: the
// collective fails on its own (the peer's connection closes) and rank 0's World then waits
// `shutdown_timeout` for rank 1 to leave, which it never will.
#include <push/dist.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <test_util.h>

#include "netbed/netbed_util.h"
#include "netbed/ranks_on_hosts.h"

using namespace std::chrono_literals;

namespace {
using namespace push::testing;

using GlooFaults = Hosts;

// All-reduces until a collective fails; rank 0 writes what it said to PUSH_TEST_OUT.
PUSH_DIST_WORKER(netbed_gloo_only) {
  auto world = push::dist::World(push::dist::WorldOptions::from_env().timeout(20s).shutdown_timeout(5s));
  auto group = world.collective();
  auto t = torch::ones({1024});
  try {
    group.all_reduce(t);
    // Ready once a collective has crossed between the hosts: the loop below is under way.
    std::ofstream(std::getenv("PUSH_TEST_OUT") + std::string(".ready" + std::to_string(world.rank()))) << "1";
    for (;;) group.all_reduce(t);
  } catch (const push::Error& e) {
    if (world.rank() == 0) std::ofstream(std::getenv("PUSH_TEST_OUT")) << e.what();
  }
}

TEST_F(GlooFaults, AKilledHostFailsTheCollectiveAtOnceAndRankZeroLeavesAfterShutdownTimeout) {
  const std::string out = ::testing::TempDir() + "/netbed_gloo_" + std::to_string(::getpid());
  NetBed bed(2);
  std::vector<int> codes;
  std::thread job([&] {
    codes = run_workers(2, "netbed_gloo_only", 90s, {"PUSH_TEST_OUT=" + out}, on_hosts(bed, {0, 1}));
  });
  wait_until([&] { return std::ifstream(out + ".ready0").good() && std::ifstream(out + ".ready1").good(); }, 60);
  const auto killed = std::chrono::steady_clock::now();
  bed.kill(1);
  job.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::ifstream in(out);
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::printf("rank 0 ended %.2f s after host 1 was killed, saying: %s\n", seconds, said.c_str());
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_NE(said.find("all_reduce"), std::string::npos) << said;
  EXPECT_NE(said.find(bed.address(1)), std::string::npos) << "names the host: " << said;  // Gloo's own words
  // The collective fails at once (the connection closes), not after its 20 s timeout; the
  // World then waits its 5 s shutdown_timeout for the rank that will never leave.
  EXPECT_LT(seconds, 5 + 4) << said;
  for (const char* f : {".ready0", ".ready1", ""}) std::remove((out + f).c_str());
}

}  // namespace
