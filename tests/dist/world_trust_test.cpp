// Joining a job: only the job's own ranks, each rank number once, within init_timeout,
// and the store listening where MASTER_ADDR says (docs/distributed.md, "Who gets in").
// Ranks here are Worlds on threads of one process, each with a store client of its own.
#include "dist_test_util.h"

#include <test_util.h>

#include "core/torch_compat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <sstream>

using namespace std::chrono_literals;
using push::dist::World;
using push::dist::WorldOptions;

namespace {

WorldOptions rank_of(int port, int rank, int size, const std::string& job, std::chrono::milliseconds init = 20s) {
  return WorldOptions().master_port(port).rank(rank).world_size(size).job_id(job).init_timeout(init);
}

/// Joins on a thread: the World, or the error it threw.
std::future<World> join(WorldOptions o) {
  return std::async(std::launch::async, [o] { return World(o); });
}

std::string error_of(std::future<World>& f) {
  try {
    f.get();
  } catch (const push::Error& e) {
    return e.what();
  }
  return "(no error)";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST(WorldTrust, ARankOfAnotherJobOnTheSamePortIsRefusedAtOnceNamingBoth) {
  const int port = push::dist::free_port();
  auto a0 = join(rank_of(port, 0, 2, "job-A"));
  // Job B's rank 1 finds job A's store (B's own rank 0 could not bind the port).
  const auto start = std::chrono::steady_clock::now();
  auto b1 = join(rank_of(port, 1, 2, "job-B"));
  const std::string error = error_of(b1);
  EXPECT_LT(seconds_since(start), 10.0);
  // The store's banner carries a hash of its job's id, not the id: this rank names its own.
  EXPECT_NE(error.find("serves another job than job 'job-B'"), std::string::npos) << error;
  EXPECT_NE(error.find("two jobs share MASTER_ADDR:MASTER_PORT"), std::string::npos) << error;
  // Job A's own rank 1 then joins, and A works.
  auto a1 = join(rank_of(port, 1, 2, "job-A"));
  World w0 = a0.get(), w1 = a1.get();
  auto t0 = torch::ones({2}), t1 = torch::full({2}, 2.0);
  auto r0 = std::async(std::launch::async, [&] { w0.collective().all_reduce(t0); });
  w1.collective().all_reduce(t1);
  r0.get();
  EXPECT_TRUE(torch::equal(t0, torch::full({2}, 3.0)));
}

TEST(WorldTrust, ARankNumberIsClaimedOnceAndTheSecondClaimNamesBothProcesses) {
  const int port = push::dist::free_port();
  auto r0 = join(rank_of(port, 0, 2, ""));
  auto r1 = join(rank_of(port, 1, 2, ""));
  World w0 = r0.get(), w1 = r1.get();
  // The same rank again, in the same (id-less) job: refused, naming the holder.
  auto again = join(rank_of(port, 1, 2, "", 5s));
  const std::string error = error_of(again);
  EXPECT_NE(error.find("rank 1 at 127.0.0.1:" + std::to_string(port) + " is taken by"), std::string::npos) << error;
  EXPECT_NE(error.find(":" + std::to_string(::getpid())), std::string::npos) << error;  // host:pid of both
  EXPECT_NE(error.find("two jobs share MASTER_ADDR:MASTER_PORT"), std::string::npos) << error;
}

TEST(WorldTrust, AMismatchedWorldSizeIsNamedOnBothSides) {
  const int port = push::dist::free_port();
  auto r0 = join(rank_of(port, 0, 2, "j"));
  auto r1 = join(rank_of(port, 1, 3, "j"));
  const std::string e1 = error_of(r1), e0 = error_of(r0);
  EXPECT_NE(e1.find("was started with WORLD_SIZE=2, this rank"), std::string::npos) << e1;
  EXPECT_NE(e1.find("with WORLD_SIZE=3"), std::string::npos) << e1;
  EXPECT_NE(e0.find("was started with WORLD_SIZE=3"), std::string::npos) << e0;
}

TEST(WorldTrust, DifferentJobSecretsAreRefusedAtJoin) {
  const int port = push::dist::free_port();
  // Rank 1 is told at once (the store cannot prove the secret); rank 0 at init_timeout,
  // counting the connections that failed its proof.
  auto r0 = join(rank_of(port, 0, 2, "j", 3s).job_secret(std::string(64, 'a')));
  auto r1 = join(rank_of(port, 1, 2, "j").job_secret(std::string(64, 'b')));
  const auto start = std::chrono::steady_clock::now();
  const std::string e1 = error_of(r1);
  EXPECT_LT(seconds_since(start), 2.5);
  EXPECT_NE(e1.find("different PUSH_JOB_SECRETs"), std::string::npos) << e1;
  const std::string e0 = error_of(r0);
  EXPECT_NE(e0.find("failed the job's secret proof (ranks given different PUSH_JOB_SECRETs"), std::string::npos) << e0;
  EXPECT_PUSH_ERROR(World(rank_of(push::dist::free_port(), 0, 1, "").job_secret("xyz")),
                    "must be 64 hexadecimal digits");
}

TEST(WorldTrust, AStoreThatAcceptsButNeverAnswersFailsTheJoinWithinInitTimeout) {
  // A listener that never accepts: the kernel completes connections into its backlog, as it
  // does for a rank 0 stopped with SIGSTOP.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const int port = ntohs(sa.sin_port);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_PUSH_ERROR(World(rank_of(port, 1, 2, "", 1500ms)), "did not answer");
  EXPECT_LT(seconds_since(start), 4.0);
  ::close(fd);
}

TEST(WorldTrust, RankZeroAloneFailsAtInitTimeoutNamingTheMissingRanks) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_PUSH_ERROR(World(rank_of(push::dist::free_port(), 0, 3, "", 1500ms)), "ranks 1, 2 did not join at 127.0.0.1:");
  const double took = seconds_since(start);
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 3.0);  // one init_timeout, not one per missing rank
}

TEST(WorldTrust, TheStoreListensOnlyWhereMasterAddrSays) {
  // Both LibTorch builds: the store is push's own (1.13's TCPStore bound every interface).
  const int port = push::dist::free_port();
  World w(rank_of(port, 0, 1, ""));
  // /proc/net/tcp: local address (hex, network order of the bytes) and port of each socket;
  // state 0A is LISTEN.
  std::ifstream tcp("/proc/net/tcp");
  std::string line, found;
  char wanted[8];
  std::snprintf(wanted, sizeof(wanted), ":%04X", port);
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 5) == wanted) found = local;
  }
  EXPECT_EQ(found, std::string("0100007F") + wanted);  // 127.0.0.1, not 00000000 (every interface)
  std::ifstream tcp6("/proc/net/tcp6");
  while (std::getline(tcp6, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    EXPECT_FALSE(state == "0A" && local.size() > 5 && local.substr(local.size() - 5) == wanted) << line;
  }
}
