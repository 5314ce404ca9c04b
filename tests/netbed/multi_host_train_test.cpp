// `push train` as one job over several hosts of the test bed (netbed.h): each host starts
// its ranks as a batch script would on a cluster (RANK, WORLD_SIZE, MASTER_ADDR = host 0's
// address, one shared PUSH_JOB_SECRET), and the job gives the numbers of `--nproc` on one
// host; a host that is killed, cut off or frozen fails the other within its deadline, naming it.
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "dist/dist_test_util.h"
#include "netbed/train_on_hosts.h"
#include "poll_real.h"

namespace {
using namespace push::testing;

constexpr const char* kArgs = "--algo ensemble --particles 4 --epochs 3 --devices 1 --quiet --out ";

using MultiHostTrain = TrainOnHosts;

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

TEST_F(MultiHostTrain, NprocOnEachOfTwoHostsIsOneJobWithTheNumbersOfOneHost) {
  // 2 hosts x 2 ranks, started by `push train --nproc 2 --nnodes 2 --node-rank K` on each.
  auto reference = run(std::string(kArgs) + "one --nproc 4");
  ASSERT_EQ(reference.code, 0) << reference.err;
  NetBed bed(2);
  ASSERT_TRUE(run_nodes(bed, std::string(kArgs) + "two --nproc 2"));
  EXPECT_EQ(metrics("two")["run"]["ranks"], 4);
  EXPECT_EQ(comparable(metrics("two")), comparable(metrics("one")));
  // Rank 0 alone reports: node 0's output has the table, labelled with its rank.
  EXPECT_NE(slurp(dir_ / "node0.log").find("[rank 0] test metric"), std::string::npos) << slurp(dir_ / "node0.log");
  EXPECT_EQ(slurp(dir_ / "node1.log").find("test metric"), std::string::npos) << slurp(dir_ / "node1.log");
}

TEST_F(MultiHostTrain, OverA50MsLinkTheJobCompletesWithTheSameNumbers) {
  // 25 ms on each host's link: 50 ms one way between the hosts, 100 ms a round trip.
  auto reference = run(std::string(kArgs) + "one --nproc 4");
  ASSERT_EQ(reference.code, 0) << reference.err;
  NetBed bed(2);
  for (int h = 0; h < 2; ++h) bed.link(h, LinkSpec{.delay_ms = 25});
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_nodes(bed, std::string(kArgs) + "slow --nproc 2"));
  std::printf("2 hosts x 2 ranks over a 50 ms link: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_EQ(comparable(metrics("slow")), comparable(metrics("one")));
}

TEST_F(MultiHostTrain, ALinkThatStallsForASecondAtRandomDelaysTheJobButNotItsNumbers) {
  auto reference = run(std::string(kArgs) + "one --nproc 4");
  ASSERT_EQ(reference.code, 0) << reference.err;
  NetBed bed(2);
  bed.link(1, LinkSpec{});  // host 1's link through the user-space switch, which can stall it
  std::mt19937 random(std::random_device{}());
  const auto stall_at = std::chrono::milliseconds(std::uniform_int_distribution<int>(500, 2500)(random));
  std::thread staller([&] {  // real time is the point: a stall at a random moment, for a second
    std::this_thread::sleep_for(stall_at);
    bed.link(1, LinkSpec{.stalled = true});
    std::this_thread::sleep_for(std::chrono::seconds(1));
    bed.link(1, LinkSpec{});
  });
  const bool ok = run_nodes(bed, std::string(kArgs) + "stalled --nproc 2");
  staller.join();
  ASSERT_TRUE(ok) << "stalled for 1 s at " << stall_at.count() << " ms";
  EXPECT_EQ(comparable(metrics("stalled")), comparable(metrics("one"))) << "stall at " << stall_at.count() << " ms";
}

TEST_F(MultiHostTrain, DasoAcrossTwoHostsGivesTheNumbersOfTwoSimulatedNodes) {
  // Its nodes are the hosts (each --nproc 2); on one host --ranks-per-node 2 simulates them.
  const std::string args = "--particles 2 --epochs 3 --devices 1 --quiet --data-parallel daso --out ";
  auto reference = run(args + "one --nproc 4 --ranks-per-node 2");
  ASSERT_EQ(reference.code, 0) << reference.err;
  NetBed bed(2);
  ASSERT_TRUE(run_nodes(bed, args + "two --nproc 2"));
  EXPECT_EQ(comparable(metrics("two")), comparable(metrics("one")));
}

/// Waits for `pid` at most `seconds`: its exit status, or nullopt (then it is killed).
std::optional<int> wait_for(pid_t pid, double seconds) {
  int status = 0;
  if (push::testing::poll_real(
          [&] { return ::waitpid(pid, &status, WNOHANG) == pid; },
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds)),
          std::chrono::milliseconds(20))) {
    return status;
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return std::nullopt;
}

/// What a fault to host 1 of a two-host job did to rank 0 (on host 0).
struct Outcome {
  std::optional<int> status;  // rank 0's exit status; nullopt: still running at the limit
  double seconds = 0;         // from the fault to rank 0's exit
  std::string log;            // rank 0's output
};

/// Every file under `dir` with its bytes.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path());
  }
  return files;
}

class HostFaults : public MultiHostTrain {
 protected:
  /// Starts a long job on two hosts (`one_way_ms` apart), lets it train, does `fault` to
  /// host 1 and waits at most `limit` seconds for rank 0 to end. Everything left in the bed
  /// is killed by it. The job would replace a checkpoint an earlier run saved, at its end:
  /// a fault during training must leave that one as it was.
  Outcome after(const std::function<void(NetBed&)>& fault, double limit, double one_way_ms = 0) {
    const std::string common = "--algo ensemble --particles 4 --devices 1 --quiet --save ckpt";
    const auto saved = run(common + " --epochs 1 --out first --nproc 2");
    EXPECT_EQ(saved.code, 0) << saved.err;
    const auto checkpoint = files_of(dir_ / "ckpt");
    EXPECT_FALSE(checkpoint.empty());
    NetBed bed(2);
    if (one_way_ms > 0) {
      for (int h = 0; h < 2; ++h) bed.link(h, LinkSpec{.delay_ms = one_way_ms / 2});
    }
    const std::string args = common + " --epochs 100000 --out run";
    const pid_t rank0 = start_rank(bed, 0, 0, 2, args);
    const pid_t rank1 = start_rank(bed, 1, 1, 2, args);
    // Training: rank 0 has spent two seconds of CPU time since it connected to host 1 (the
    // join and the distribution's start cost little; over a 50 ms link they take seconds,
    // longer with LibTorch 2's store). A fixed wait would be too short on a loaded machine:
    // a fault before the join ends costs init_timeout (120 s).
    const auto joining = std::chrono::steady_clock::now();
    const auto left = [&] { return std::chrono::seconds(120) - (std::chrono::steady_clock::now() - joining); };
    push::testing::poll_real([&] { return connected_to(rank0, bed.address(1)); }, left(),
                             std::chrono::milliseconds(50));
    const double joined_cpu = cpu_seconds(rank0);
    push::testing::poll_real([&] { return cpu_seconds(rank0) >= joined_cpu + 2; }, left(),
                             std::chrono::milliseconds(50));
    const auto start = std::chrono::steady_clock::now();
    fault(bed);
    Outcome o;
    o.status = wait_for(rank0, limit);
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    o.log = log(0);
    bed.kill(1);
    bed.thaw(1);
    ::waitpid(rank1, nullptr, 0);
    std::printf("rank 0 ended %.2f s after the fault: %s\n", o.seconds, o.log.c_str());
    EXPECT_EQ(files_of(dir_ / "ckpt"), checkpoint) << "the last checkpoint changed";
    return o;
  }
  /// Rank 0 failed (not killed by the limit), with one line naming rank 1, and published
  /// nothing.
  void expect_failed_naming_rank_1(const Outcome& o) {
    ASSERT_TRUE(o.status.has_value()) << "rank 0 still ran at the limit:\n" << o.log;
    EXPECT_TRUE(WIFEXITED(*o.status) && WEXITSTATUS(*o.status) != 0) << o.log;
    EXPECT_NE(o.log.find("rank 1"), std::string::npos) << o.log;
    EXPECT_FALSE(fs::exists(dir_ / "run"));
  }
};

TEST_F(HostFaults, AKilledHostFailsTheOtherAtOnceNamingIt) {
  const auto o = after([](NetBed& bed) { bed.kill(1); }, 60);
  expect_failed_naming_rank_1(o);
  // The connections close with the host's processes: rank 0 need not wait out a timeout
  // (before, it waited shutdown_timeout, 30 s, for rank 1 to leave).
  EXPECT_LT(o.seconds, 5) << o.log;
}

TEST_F(HostFaults, APartitionedHostFailsTheOtherWithinTheHeartbeatTimeout) {
  // Nothing closes: only silence. RPC heartbeats (30 s, found within 1.25 times that).
  const auto o = after([](NetBed& bed) { bed.partition(1); }, 90);
  expect_failed_naming_rank_1(o);
  EXPECT_LT(o.seconds, 30 * 1.25 + 4) << o.log;
}

TEST_F(HostFaults, AFrozenHostFailsTheOtherWithinTheHeartbeatTimeout) {
  const auto o = after([](NetBed& bed) { bed.freeze(1); }, 90);
  expect_failed_naming_rank_1(o);
  EXPECT_LT(o.seconds, 30 * 1.25 + 4) << o.log;
}

// The same faults with the hosts 50 ms apart: the deadlines hold (a killed host is still
// found by its closed connections, a frozen one by the heartbeats, which a slow link only
// delays by a round trip).
TEST_F(HostFaults, OverA50MsLinkAKilledHostFailsTheOtherAtOnce) {
  const auto o = after([](NetBed& bed) { bed.kill(1); }, 60, 50);
  expect_failed_naming_rank_1(o);
  EXPECT_LT(o.seconds, 5) << o.log;
}

TEST_F(HostFaults, OverA50MsLinkAFrozenHostFailsTheOtherWithinTheHeartbeatTimeout) {
  const auto o = after([](NetBed& bed) { bed.freeze(1); }, 90, 50);
  expect_failed_naming_rank_1(o);
  EXPECT_LT(o.seconds, 30 * 1.25 + 4) << o.log;
}

}  // namespace
