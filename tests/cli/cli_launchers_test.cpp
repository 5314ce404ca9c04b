// `push train` under the launchers users start jobs with: torchrun (torch 2.x, which hosts
// the store itself), Open MPI's mpirun and Slurm's srun (its variables, set here by hand as
// srun sets them). Each gives the numbers `push train --nproc 2` gives.
#include <push/dist/free_port.h>

#include "cli_test_util.h"

namespace {
using namespace push::testing;

constexpr const char* kArgs = "--algo ensemble --particles 4 --epochs 3 --devices 1 --quiet --out ";

class Launchers : public Cli {
 protected:
  /// `push train --nproc 2` into `out`, the numbers every launcher must give.
  json reference() {
    auto r = run(std::string(kArgs) + "nproc");
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return metrics("nproc");
  }
  /// Runs the job under `launcher` into `out` and checks it gives the reference numbers.
  void expect_same_numbers_under(const std::string& launcher, const std::string& out) {
    const json expected = reference();
    launcher_ = launcher;
    auto r = run(std::string(kArgs) + out);
    launcher_.clear();
    ASSERT_EQ(r.code, 0) << launcher << "\n" << r.out << r.err;
    const json m = metrics(out);
    EXPECT_EQ(m["run"]["ranks"], 2) << launcher;
    EXPECT_EQ(comparable(m), comparable(expected)) << launcher;
    // Rank 0 alone prints the table (these launchers do not prefix lines with the rank).
    const auto first = r.out.find("test metric");
    EXPECT_NE(first, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("test metric", first + 1), std::string::npos) << r.out;
  }
};

TEST_F(Launchers, TorchrunGivesTheNumbersOfNproc) {
  // torchrun's agent serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE).
  const std::string torchrun =
      std::string("'" PUSH_TORCHRUN "' --nproc-per-node 2 --master-addr 127.0.0.1 --master-port ") +
      std::to_string(push::dist::free_port()) + " --no-python";
#if TORCH_VERSION_MAJOR >= 2
  expect_same_numbers_under(torchrun, "torchrun");
#else
  // LibTorch 1.13's store client cannot talk to torchrun 2.x's store: each rank says so at
  // once, instead of waiting out the rendezvous timeout.
  launcher_ = torchrun;
  auto r = run(std::string(kArgs) + "torchrun");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("whose store client cannot talk to torchrun 2.x's"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "torchrun"));
#endif
}

TEST_F(Launchers, MpirunGivesTheNumbersOfNproc) {
  // Open MPI sets OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; the store's address is
  // the user's to give, as with any launcher that has none.
  const int port = push::dist::free_port();
  expect_same_numbers_under(std::string("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '" PUSH_MPIRUN
                                        "' -np 2 --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=") +
                                std::to_string(port),
                            "mpirun");
}

TEST_F(Launchers, SlurmVariablesGiveTheNumbersOfNproc) {
  // What `srun --ntasks 2 --ntasks-per-node 2` sets in each task (docs/distributed.md has
  // the recipe), set by hand: two plain processes that only these variables join.
  const json expected = reference();
  const std::string port = std::to_string(push::dist::free_port());
  std::vector<pid_t> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    tasks.push_back(start(std::string(kArgs) + "slurm", dir_ / ("task" + r + ".log"),
                          {"SLURM_PROCID=" + r, "SLURM_LOCALID=" + r, "SLURM_NTASKS=2", "SLURM_NTASKS_PER_NODE=2",
                           "SLURM_NODEID=0", "SLURM_JOB_ID=4242", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}));
  }
  for (pid_t pid : tasks) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << slurp(dir_ / "task0.log") << slurp(dir_ / "task1.log");
  }
  const json m = metrics("slurm");
  EXPECT_EQ(m["run"]["ranks"], 2);
  EXPECT_EQ(comparable(m), comparable(expected));
}

}  // namespace
