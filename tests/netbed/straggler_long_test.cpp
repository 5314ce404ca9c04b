// The asynchronous parameter server (examples/parameter_server.cpp) with 3 workers on hosts
// of their own, one of them behind a 50 ms link, against the same with no slow link, in one
// run on the test bed: a straggler must not hold the others back. The table of docs/
// several-hosts.md ("A straggler"). Long: about 15 s.
//
// Host 0 runs the server (rank 0), hosts 1-3 a worker each (ranks 1-3). Every link goes
// through the bed's switch in both runs; in the second, host 3's adds 50 ms each way, so
// each of its round trips to the server takes over 100 ms. Every worker trains 4 s.
#include <chrono>
#include <cstdio>
#include <regex>
#include <thread>

#include "dist/dist_test_util.h"
#include "netbed/netbed_util.h"

namespace {
using namespace push::testing;

using Straggler = Hosts;

constexpr int kWorkers = 3;
constexpr const char* kSeconds = "4";  // each worker trains this long, whatever its pace

/// Each worker's steps per second (index 0: rank 1), or empty when a rank failed. Every rank
/// runs with a deadline and dies with this process (run_program).
std::vector<double> train(const NetBed& bed) {
  std::vector<std::pair<int, std::string>> ran(kWorkers + 1);
  std::vector<std::thread> ranks;
  for (int r = 0; r <= kWorkers; ++r) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    for (const auto& word : bed.exec_argv(r)) argv.push_back(word);
    argv.insert(argv.end(), {PUSH_EXAMPLE_PARAMETER_SERVER, "--steps", "1000000", "--seconds", kSeconds});
    const std::vector<std::string> env = {"RANK=" + std::to_string(r),
                                          "WORLD_SIZE=" + std::to_string(kWorkers + 1),
                                          "LOCAL_RANK=0",
                                          "LOCAL_WORLD_SIZE=1",
                                          "MASTER_ADDR=" + bed.address(0),
                                          "MASTER_PORT=29500"};
    ranks.emplace_back(
        [&ran, r, argv, env] { ran[static_cast<size_t>(r)] = run_program(argv, env, std::chrono::seconds(120)); });
  }
  for (auto& t : ranks) t.join();
  std::vector<double> pace;
  for (int r = 0; r <= kWorkers; ++r) {
    const auto& [code, out] = ran[static_cast<size_t>(r)];
    EXPECT_EQ(code, 0) << "rank " << r << ": " << out;
    if (code != 0) return {};
    if (r == 0) {
      // Every gradient a worker pushed was applied.
      std::smatch m;
      EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(steps (\d+) \(of (\d+) pushed\))")) && m[1] == m[2]) << out;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(out, m, std::regex(R"(steps in [0-9.]+ s, ([0-9.]+) steps/s)"))) {
      ADD_FAILURE() << "rank " << r << " printed no pace: " << out;
      return {};
    }
    pace.push_back(std::stod(m[1].str()));
  }
  return pace;
}

TEST_F(Straggler, AWorkerBehindA50MsLinkDoesNotHoldTheOthersBack) {
  if (std::string(PUSH_EXAMPLE_PARAMETER_SERVER).empty()) GTEST_SKIP() << "built without the examples";
  NetBed bed(kWorkers + 1);
  for (int h = 0; h <= kWorkers; ++h) bed.link(h, LinkSpec{});
  const auto even = train(bed);
  bed.link(kWorkers, LinkSpec{.delay_ms = 50});
  const auto slow = train(bed);
  ASSERT_EQ(even.size(), 3u);
  ASSERT_EQ(slow.size(), 3u);
  std::printf("steps/s      worker 1   worker 2   worker 3 (host 3)\n");
  std::printf("no slow link %8.1f   %8.1f   %8.1f\n", even[0], even[1], even[2]);
  std::printf("host 3 50 ms %8.1f   %8.1f   %8.1f\n", slow[0], slow[1], slow[2]);
  const double fast_even = (even[0] + even[1]) / 2, fast_slow = (slow[0] + slow[1]) / 2;
  std::printf("workers 1-2 with the straggler / without: %.2f; worker 3: %.3f\n", fast_slow / fast_even,
              slow[2] / even[2]);
  // The straggler's step is a pull (the newest version, then the model: two round trips)
  // and a push (one), each round trip 100 ms: at most 3.3 a second. The others keep their pace (they gain a little: the
  // straggler leaves them the cores it no longer uses, so a small slowdown could hide in this ratio; a straggler that
  // held them would bring them near its own pace, far below).
  EXPECT_LT(slow[2], 4.0);
  EXPECT_GT(fast_slow / fast_even, 0.9);
}

}  // namespace
