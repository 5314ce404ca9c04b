// A job started without PUSH_JOB_SECRET (ranks by hand, mpirun, srun): rank 0 draws the
// secret and hands it on through a file only this user can read, never through the store,
// which any local user can read (docs/distributed.md, "The job secret").
#include "dist_test_util.h"

#include <test_util.h>

#include "../poll_real.h"
#include "dist/rendezvous/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>

using namespace std::chrono_literals;
using push::dist::World;
using push::dist::WorldOptions;
namespace hs = push::dist::detail::handshake;
namespace secret_file = push::dist::detail::secret_file;

namespace {

WorldOptions secret_rank(int port, int rank, const std::string& job) {
  return WorldOptions().master_port(port).rank(rank).world_size(2).job_id(job).init_timeout(20s).shutdown_timeout(5s);
}

/// Whether uid 65534 (nobody) can open `path` for reading: tried in a child that drops to it.
bool nobody_can_read(const std::string& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::_exit(fd >= 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// An empty folder of this test's, mode 0700.
std::string fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("push-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  return dir.string();
}

}  // namespace

TEST(WorldSecret, ADrawnSecretIsHandedOnInAFileOnlyThisUserCanReadNeverThroughTheStore) {
  const int port = push::dist::free_port();
  const std::string job = "drawn-" + std::to_string(port);
  const std::string path = secret_file::path_for("127.0.0.1", port, job);
  {
    auto r1 = std::async(std::launch::async, [&] { return World(secret_rank(port, 1, job)); });
    World w0(secret_rank(port, 0, job));
    World w1 = r1.get();
    // An outsider's client of the store: what the last version kept there is gone.
    auto outsider = w0.store();
    EXPECT_FALSE(outsider.check({"push/world/" + job + "/secret"}));
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_uid, ::geteuid());
    if (::geteuid() == 0) EXPECT_FALSE(nobody_can_read(path)) << "another user read " << path;
    // Both ranks hold the same secret: an RPC group (whose key derives from it) forms.
    auto g1 = std::async(std::launch::async, [&] { return w1.rpc_group("g", {"worker0", "worker1"}); });
    auto g0 = w0.rpc_group("g", {"worker0", "worker1"});
    auto group1 = g1.get();
    auto s1 = std::async(std::launch::async, [&] { group1.shutdown(); });
    g0.shutdown();
    s1.get();
    auto leave1 = std::async(std::launch::async, [w = std::move(w1)]() mutable { World gone = std::move(w); });
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "rank 0 left " << path << " behind";
}

TEST(WorldSecret, ASecondRankZeroOnATakenPortLeavesTheRunningJobsFileAlone) {
  // Before, rank 0 wrote its secret file before it bound MASTER_PORT: a second rank 0 of the
  // same job id (started twice by mistake) replaced the running job's file, failed to bind,
  // and removed the file as it left; the running job's rank 1 then could not join.
  const int port = push::dist::free_port();
  const std::string job = "twice-" + std::to_string(port);
  auto r0 = std::async(std::launch::async, [&] { return World(secret_rank(port, 0, job)); });
  const std::string path = secret_file::path_for("127.0.0.1", port, job);
  ASSERT_TRUE(push::testing::poll_real([&] { return ::access(path.c_str(), F_OK) == 0; }, 10s)) << path;
  EXPECT_PUSH_ERROR(World(secret_rank(port, 0, job)), "cannot host the store at 127.0.0.1:" + std::to_string(port));
  World w1(secret_rank(port, 1, job));
  World w0 = r0.get();
  EXPECT_EQ(w1.size(), 2);
  auto leave1 = std::async(std::launch::async, [w = std::move(w1)]() mutable { World gone = std::move(w); });
}

TEST(WorldSecret, AFileThatIsNotPrivateOrNotRankZerosIsRefusedInOneLine) {
  const auto dir = fresh_dir("secret-file");
  const hs::Bytes secret = hs::random_bytes();
  const std::string fingerprint = hs::fingerprint(secret);
  const std::string good = dir + "/good";
  secret_file::write(good, secret);
  EXPECT_EQ(secret_file::read(good, fingerprint), secret);
  EXPECT_PUSH_ERROR(secret_file::read(dir + "/missing", fingerprint), "is this rank on another host than rank 0?");
  EXPECT_PUSH_ERROR(secret_file::read(good, hs::fingerprint(hs::random_bytes())), "another secret than rank 0's");
  const std::string open_to_all = dir + "/open";
  secret_file::write(open_to_all, secret);
  ::chmod(open_to_all.c_str(), 0644);
  EXPECT_PUSH_ERROR(secret_file::read(open_to_all, fingerprint), "its mode 0644 lets other users in");
  const std::string link = dir + "/link";
  ASSERT_EQ(::symlink(good.c_str(), link.c_str()), 0);
  EXPECT_PUSH_ERROR(secret_file::read(link, fingerprint), "PUSH_JOB_SECRET");
  const std::string garbage = dir + "/garbage";
  std::ofstream(garbage) << "not a secret\n";
  ::chmod(garbage.c_str(), 0600);
  EXPECT_PUSH_ERROR(secret_file::read(garbage, fingerprint), "does not hold 64 hexadecimal digits");
  const std::string folder = dir + "/folder";
  ::mkdir(folder.c_str(), 0700);
  EXPECT_PUSH_ERROR(secret_file::read(folder, fingerprint), "not a regular file");
  std::filesystem::remove_all(dir);
}

// Each rank with a private folder of its own, as on two hosts: rank 1 cannot read what
// rank 0 drew, and says how to give the job a secret instead.
PUSH_DIST_WORKER(secret_on_two_hosts) {
  const std::string folder = std::string(std::getenv("SECRET_TEST_DIR")) + "/rank" + std::getenv("RANK");
  ::mkdir(folder.c_str(), 0700);
  ::setenv("XDG_RUNTIME_DIR", folder.c_str(), 1);
  auto options = WorldOptions::from_env().init_timeout(20s).shutdown_timeout(2s);
  if (options.rank() == 0) {
    // Rank 1 never gets into the store: rank 0 names it at its init_timeout.
    EXPECT_PUSH_ERROR(World{options.init_timeout(3s)}, "rank 1 did not join");
    return;
  }
  // Told at once: rank 0's store answers, so its file is written, but not where this rank looks.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_PUSH_ERROR(World{options}, "rank 0 drew the job's secret into");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  // Alone, a rank needs no one to hand its secret to.
  World alone(options.master_port(push::dist::free_port()).world_size(1).rank(0));
  EXPECT_EQ(alone.size(), 1);
}

TEST(WorldSecret, ARankThatCannotReadRankZerosFileSaysHowToGiveASecret) {
  const auto dir = fresh_dir("secret-hosts");
  ::chmod(dir.c_str(), 0700);
  const auto codes =
      push::testing::run_workers(2, "secret_on_two_hosts", 60s, {"SECRET_TEST_DIR=" + dir, "PUSH_JOB_SECRET="});
  push::testing::expect_all_ok(codes);
  std::filesystem::remove_all(dir);
}
