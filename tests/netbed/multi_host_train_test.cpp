// `push train` as one job over several hosts of the test bed (netbed.h): each host starts
// its ranks as a batch script would on a cluster (RANK, WORLD_SIZE, MASTER_ADDR = host 0's
// address, one shared PUSH_JOB_SECRET), and the job gives the numbers of `--nproc` on one
// host; a host that dies or is cut off fails the others within their deadline, naming it.
#include <push/dist/world.h>

#include "cli/cli_test_util.h"
#include "netbed/netbed.h"

namespace {
using namespace push::testing;

constexpr const char* kArgs = "--algo ensemble --particles 4 --epochs 3 --devices 1 --quiet --out ";

class MultiHostTrain : public Cli {
 protected:
  void SetUp() override {
    if (const auto why = NetBed::unavailable(); !why.empty()) GTEST_SKIP() << "no test bed here: " << why;
    Cli::SetUp();
  }
  /// Starts rank `rank` of `world` on host `host` of `bed`: `push train ARGS`, its output to
  /// rank<R>.log in the test's folder.
  pid_t start_rank(const NetBed& bed, int host, int rank, int world, const std::string& args,
                   const std::vector<std::string>& env = {}) {
    launcher_ = bed.exec_prefix(host);
    std::vector<std::string> vars = {
        "RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=0",
        "LOCAL_WORLD_SIZE=1",           "MASTER_ADDR=" + bed.address(0),       "MASTER_PORT=29500",
        "PUSH_JOB_ID=netbed",           "PUSH_JOB_SECRET=" + secret_};
    vars.insert(vars.end(), env.begin(), env.end());
    const pid_t pid = start(args, dir_ / ("rank" + std::to_string(rank) + ".log"), vars);
    launcher_.clear();
    return pid;
  }
  std::string log(int rank) { return slurp(dir_ / ("rank" + std::to_string(rank) + ".log")); }
  std::string secret_ = push::dist::new_job_secret();
};

TEST_F(MultiHostTrain, OneJobOverTwoHostsGivesTheNumbersOfOneHost) {
  auto reference = run(std::string(kArgs) + "nproc --nproc 2");
  ASSERT_EQ(reference.code, 0) << reference.err;
  NetBed bed(2);
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 2; ++rank) ranks.push_back(start_rank(bed, rank, rank, 2, std::string(kArgs) + "hosts"));
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    ASSERT_EQ(::waitpid(ranks[static_cast<size_t>(rank)], &status, 0), ranks[static_cast<size_t>(rank)]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << ":\n" << log(rank);
  }
  const json m = metrics("hosts");
  EXPECT_EQ(m["run"]["ranks"], 2);
  EXPECT_EQ(comparable(m), comparable(metrics("nproc")));
}

}  // namespace
