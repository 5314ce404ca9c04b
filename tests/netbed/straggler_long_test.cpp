// The asynchronous parameter server (examples/parameter_server.cpp) with 3 workers on hosts
// of their own, one of them behind a 50 ms link, against the same with no slow link, in one
// run on the test bed: a straggler must not hold the others back. The table of docs/
// several-hosts.md ("A straggler"). Long: about a minute.
//
// Host 0 runs the server (rank 0), hosts 1-3 a worker each (ranks 1-3). Every link goes
// through the bed's switch in both runs; in the second, host 3's adds 50 ms each way, so
// each of its pulls (a round trip to the server) takes over 100 ms.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "cli/cli_test_util.h"
#include "netbed/netbed_util.h"

namespace {
using namespace push::testing;

using Straggler = Hosts;

constexpr int kWorkers = 3;
constexpr int kSteps = 150;

/// Each worker's steps per second (index 0: rank 1), or empty when a rank failed.
std::vector<double> train(const NetBed& bed, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<pid_t> ranks;
  for (int r = 0; r <= kWorkers; ++r) {
    ranks.push_back(spawn("env RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(kWorkers + 1) +
                          " LOCAL_RANK=0 MASTER_ADDR=" + bed.address(0) + " MASTER_PORT=29500 " + bed.exec_prefix(r) +
                          " " + PUSH_EXAMPLE_PARAMETER_SERVER + " --steps " + std::to_string(kSteps) + " > " +
                          (dir / ("rank" + std::to_string(r) + ".log")).string() + " 2>&1"));
  }
  bool ok = true;
  for (int r = 0; r <= kWorkers; ++r) {
    int status = 0;
    ::waitpid(ranks[static_cast<size_t>(r)], &status, 0);
    const bool exited = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    EXPECT_TRUE(exited) << "rank " << r << ": " << slurp(dir / ("rank" + std::to_string(r) + ".log"));
    ok = ok && exited;
  }
  if (!ok) return {};
  std::vector<double> pace;
  for (int r = 1; r <= kWorkers; ++r) {
    const auto log = slurp(dir / ("rank" + std::to_string(r) + ".log"));
    std::smatch m;
    if (!std::regex_search(log, m, std::regex(R"(steps in [0-9.]+ s, ([0-9.]+) steps/s)"))) {
      ADD_FAILURE() << "rank " << r << " printed no pace: " << log;
      return {};
    }
    pace.push_back(std::stod(m[1].str()));
  }
  return pace;
}

TEST_F(Straggler, AWorkerBehindA50MsLinkDoesNotHoldTheOthersBack) {
  if (std::string(PUSH_EXAMPLE_PARAMETER_SERVER).empty()) GTEST_SKIP() << "built without the examples";
  const auto dir = std::filesystem::temp_directory_path() / ("push_straggler_" + std::to_string(::getpid()));
  NetBed bed(kWorkers + 1);
  for (int h = 0; h <= kWorkers; ++h) bed.link(h, LinkSpec{});
  const auto even = train(bed, dir / "even");
  bed.link(kWorkers, LinkSpec{.delay_ms = 50});
  const auto slow = train(bed, dir / "slow");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(even.size(), 3u);
  ASSERT_EQ(slow.size(), 3u);
  std::printf("steps/s      worker 1   worker 2   worker 3 (host 3)\n");
  std::printf("no slow link %8.1f   %8.1f   %8.1f\n", even[0], even[1], even[2]);
  std::printf("host 3 50 ms %8.1f   %8.1f   %8.1f\n", slow[0], slow[1], slow[2]);
  const double fast_even = (even[0] + even[1]) / 2, fast_slow = (slow[0] + slow[1]) / 2;
  std::printf("workers 1-2 with the straggler / without: %.2f; worker 3: %.3f\n", fast_slow / fast_even,
              slow[2] / even[2]);
  // The straggler is slow (a pull is a 100 ms round trip), the others keep their pace.
  EXPECT_LT(slow[2], 12.0);
  EXPECT_GT(fast_slow / fast_even, 0.8);
}

}  // namespace
