// `push train --nproc N`: one distribution over N local ranks. The same seed gives the same
// metrics.json numbers on 2 ranks x 1 lane as on 1 rank x 2 lanes and 1 rank x 1 lane, for
// every algorithm; only rank 0 reports and writes; a rank killed mid-training stops the
// job with a non-zero exit and leaves the last checkpoint intact.
#include "cli_test_util.h"

#include <dirent.h>

#include <chrono>
#include <tuple>

#include "core/clock.h"
#include "test_util.h"

namespace {
using namespace push::testing;
using namespace std::chrono_literals;
using push::detail::Clock;

TEST_F(Cli, TwoRanksGiveTheSameNumbersAsOneRankWithOneOrTwoLanes) {
  for (const std::string algo : {"ensemble", "mswag", "svgd", "mcdropout", "sgld", "sghmc"}) {
    const std::string common = "--algo " + algo + " --particles 4 --epochs 3" + samples(algo, 3) + " --quiet --out ";
    auto one = run(common + algo + "-1x1 --devices 1");
    ASSERT_EQ(one.code, 0) << one.err;
    auto lanes = run(common + algo + "-1x2 --devices 2");
    ASSERT_EQ(lanes.code, 0) << lanes.err;
    auto ranks = run(common + algo + "-2x1 --devices 1 --nproc 2");
    ASSERT_EQ(ranks.code, 0) << ranks.out << ranks.err;
    const auto m1 = metrics(algo + "-1x1"), m2 = metrics(algo + "-1x2"), mr = metrics(algo + "-2x1");
    EXPECT_EQ(mr["run"]["ranks"], 2);
    // Bitwise: the JSON numbers are written with every digit.
    EXPECT_EQ(comparable(m1), comparable(m2)) << algo;
    EXPECT_EQ(comparable(m1), comparable(mr)) << algo;
    // Only rank 0 prints the table.
    EXPECT_NE(ranks.out.find("[rank 0] test metric"), std::string::npos) << ranks.out;
    EXPECT_EQ(ranks.out.find("[rank 1] test metric"), std::string::npos) << ranks.out;
  }
}

// --nproc loads --data once, in the process that starts the ranks (which checks it before any
// rank starts), and hands the rows to its ranks; ranks started by push launch load it
// themselves. Both give the same numbers; a stray PUSH_TRAIN_DATA_FD is not read.
TEST_F(Cli, NprocLoadsTheDataOnceAndHandsTheRowsToItsRanks) {
  {
    std::ofstream csv(dir_ / "rows.csv");
    csv << "a,b,y\n";
    for (int i = 0; i < 120; ++i) csv << i % 7 << "," << i % 5 << "," << (i % 7) + 2 * (i % 5) + (i % 3) * 0.1 << "\n";
  }
  const std::string common = "--data rows.csv --particles 2 --epochs 2 --devices 1 --quiet --out ";
  auto handed = run(common + "handed --nproc 2");
  ASSERT_EQ(handed.code, 0) << handed.out << handed.err;
  launcher_ = "'" PUSH_CLI_BINARY "' launch --nproc 2 --";
  auto own = run(common + "own");
  launcher_.clear();
  ASSERT_EQ(own.code, 0) << own.out << own.err;
  auto stray = run(common + "stray", -1, "", {"PUSH_TRAIN_DATA_FD=0"});
  ASSERT_EQ(stray.code, 0) << stray.out << stray.err;
  const json h = metrics("handed"), o = metrics("own"), s = metrics("stray");
  EXPECT_EQ(h["data"]["loaded_by"], "push train --nproc, once for its ranks");
  EXPECT_EQ(o["data"]["loaded_by"], "this rank");
  EXPECT_EQ(s["data"]["loaded_by"], "this rank");
  EXPECT_EQ(h["data"]["train_size"], 96);
  EXPECT_EQ(comparable(h), comparable(o));
}

// --data-parallel: every rank trains every particle on its share of the rows; rank 0
// writes the usual outputs, with the mode in metrics.json, and a blocking run resumes to
// the numbers of an uninterrupted one. Bad combinations are named, on standard error (a
// rank's stderr is the launcher's, prefixed with the rank; its stdout, the table, stays on
// standard output).
TEST_F(Cli, DataParallelModesTrainAndWriteTheUsualOutputs) {
  const std::string common = "--particles 2 --epochs 20 --quiet --out ";
  for (const std::string mode : {"blocking", "nonblocking", "daso"}) {
    const std::string ranks = mode == "daso" ? " --nproc 4 --ranks-per-node 2" : " --nproc 2";
    auto r = run(common + "dp-" + mode + " --data-parallel " + mode + ranks);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const auto m = metrics("dp-" + mode);
    EXPECT_EQ(m["run"]["data_parallel"], mode);
    EXPECT_EQ(m["run"]["fused"], false);
    const double rmse = m["metrics"]["rmse"].get<double>();
    EXPECT_LT(rmse, 0.5) << mode;  // the untrained networks' is about 1
    EXPECT_TRUE(fs::exists(dir_ / ("dp-" + mode) / "predictions.csv"));
    EXPECT_NE(r.out.find("[rank 0] test metric"), std::string::npos) << r.out;
  }
  // Saved after 3 epochs and resumed to 6: the numbers of 6 epochs in one go, bit for bit
  // (at a constant rate: a cosine follows each run's --epochs, 3 in the first).
  const std::string dp = "--particles 2 --quiet --nproc 2 --data-parallel blocking --lr-schedule constant";
  ASSERT_EQ(run("--epochs 6 --out dp-whole " + dp).code, 0);
  ASSERT_NO_FATAL_FAILURE(save_then_resume(dp, 3, 6));
  EXPECT_EQ(metrics("dp-whole")["metrics"], metrics("b")["metrics"]);
  EXPECT_EQ(metrics("dp-whole")["loss_curve"], metrics("b")["loss_curve"]);
  // Bad combinations: (arguments, the exit code or -1 for any but 0, what stderr names).
  const std::vector<std::tuple<std::string, int, std::string>> refused = {
      {"--data-parallel blocking", 1, "needs several ranks"},
      {"--data-parallel daso --nproc 2", -1, "needs at least 2 nodes"},
      {"--algo svgd --data-parallel blocking --nproc 2", -1, "does not train svgd"},
      {"--data-parallel sometimes --nproc 2", 2, "--data-parallel"},
      {"--ranks-per-node 1 --data-parallel blocking --nproc 2", -1, "--ranks-per-node is for --data-parallel daso"},
  };
  for (const auto& [args, code, needle] : refused) {
    auto r = run(args + " --epochs 1 --quiet --out x");
    if (code >= 0) {
      EXPECT_EQ(r.code, code) << args;
    } else {
      EXPECT_NE(r.code, 0) << args;
    }
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.out << r.err;
  }
}

TEST_F(Cli, NprocMustMatchTheJobItRunsIn) {
  // Under a launcher (WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS set) --nproc must agree with it.
  for (const std::string size : {"WORLD_SIZE=2", "OMPI_COMM_WORLD_SIZE=2", "SLURM_NTASKS=2"}) {
    auto r = run("--nproc 3 --epochs 1 --quiet --out x", -1, "", {size, "RANK=0"});
    EXPECT_EQ(r.code, 1) << size;
    EXPECT_NE(r.err.find("--nproc 3 differs from the job's 2 ranks (the launcher's WORLD_SIZE"), std::string::npos)
        << size << ": " << r.err;
  }
}

// The processes whose environment holds `tag` and `RANK=<rank>`.
std::vector<pid_t> ranks_tagged(const std::string& tag, int rank) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  while (dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string env = slurp(fs::path("/proc") / e->d_name / "environ");
    auto has = [&](const std::string& var) {
      return env.find(std::string(1, '\0') + var + '\0') != std::string::npos || env.rfind(var + '\0', 0) == 0;
    };
    if (has(tag) && has("RANK=" + std::to_string(rank))) out.push_back(pid);
  }
  ::closedir(proc);
  return out;
}

TEST_F(Cli, ARankKilledMidTrainingStopsTheJobAndKeepsTheCheckpoint) {
  auto first = run("--epochs 2 --particles 4 --quiet --out first --save ckpt --nproc 2 --devices 1");
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  const std::string manifest = slurp(dir_ / "ckpt" / "checkpoint" / "particles" / "push.manifest");
  ASSERT_FALSE(manifest.empty());
  // A long run that would replace the checkpoint; rank 1 is killed while it trains.
  const std::string tag = "PUSH_TEST_TAG=" + std::to_string(::getpid()) + "-killed";
  const pid_t job =
      start("--epochs 100000 --particles 4 --out second --save ckpt --nproc 2 --devices 1", dir_ / "run.log", {tag});
  auto stop_job = [&] {  // a test that fails before the kill leaves no job running
    ::kill(job, SIGKILL);
    ::waitpid(job, nullptr, 0);
  };
  std::vector<pid_t> victims;
  Clock::poll_until(Clock::deadline_after(30s), 50ms, [&] {
    victims = ranks_tagged(tag, 1);
    return !victims.empty();
  });
  if (victims.size() != 1u) stop_job();
  ASSERT_EQ(victims.size(), 1u) << "rank 1 did not start";
  // Rank 0 stages --out and --save once every check has passed, just before training.
  const bool staged = Clock::poll_until(Clock::deadline_after(60s), 20ms, [&] {
    const auto names = entries();
    return !staging_folders(names, ".second.partial-").empty() && !staging_folders(names, ".ckpt.partial-").empty();
  });
  if (!staged) stop_job();
  ASSERT_TRUE(staged) << "rank 0 did not get to training: " << slurp(dir_ / "run.log");
  // The kill must land in the epochs, past the distribution's setup: rank 0's progress bar
  // shows an epoch done.
  const bool training = Clock::poll_until(
      Clock::deadline_after(60s), 20ms, [&] { return slurp(dir_ / "run.log").find("] epoch ") != std::string::npos; });
  if (!training) stop_job();
  ASSERT_TRUE(training) << "the job did not start training: " << slurp(dir_ / "run.log");
  ::kill(victims[0], SIGKILL);
  const auto killed = Clock::now();
  int status = 0;
  pid_t done = 0;
  Clock::poll_until(Clock::deadline_after(60s), 20ms, [&] { return (done = ::waitpid(job, &status, WNOHANG)) != 0; });
  if (done == 0) {
    stop_job();
    FAIL() << "the job went on after rank 1 died: " << slurp(dir_ / "run.log");
  }
  EXPECT_LT(Clock::now() - killed, 10s) << slurp(dir_ / "run.log");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << slurp(dir_ / "run.log");
  EXPECT_TRUE(ranks_tagged(tag, 0).empty()) << "rank 0 outlived the job";
  // The checkpoint is the first run's, whole, and a run resumes from it.
  EXPECT_EQ(slurp(dir_ / "ckpt" / "checkpoint" / "particles" / "push.manifest"), manifest);
  EXPECT_FALSE(fs::exists(dir_ / "second"));
  auto resumed = run("--epochs 3 --particles 4 --quiet --out third --resume ckpt --devices 2");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

}  // namespace

TEST_F(Cli, ARefusedOutEndsEveryRankAtOnceWithOneLine) {
  // A folder of the user's own: push train may not replace it. Checked before the ranks meet.
  fs::create_directories(dir_ / "mine");
  std::ofstream(dir_ / "mine" / "notes.txt") << "my notes\n";
  const auto start = std::chrono::steady_clock::now();
  auto r = run("--nproc 2 --epochs 1 --quiet --out mine");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0);
  EXPECT_LT(took, 20.0);  // not rank 0's 30 s wait for the others to leave
  EXPECT_NE(r.err.find("push train: --out 'mine' holds"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[push train]"), std::string::npos) << r.err << ": the origin twice";
  EXPECT_EQ(r.err.find("did not"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("shutdown"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "mine" / "notes.txt"));
}
