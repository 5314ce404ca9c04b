// The memory a process may still use: cgroup v1 and v2 limits, nested ones included, read
// from folders laid out as the kernel lays them out, and from a real cgroup where the test
// may make one.
#include "core/host_memory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace push::detail {
namespace {
namespace fs = std::filesystem;

class HostMemory : public ::testing::Test {
 protected:
  fs::path root_ = fs::temp_directory_path() / ("push_host_memory_test_" + std::to_string(::getpid()));
  void SetUp() override { fs::remove_all(root_); }
  void TearDown() override { fs::remove_all(root_); }
  void write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text << "\n";
  }
};

TEST_F(HostMemory, TheTightestLimitOfTheCgroupAndItsParentsCounts) {
  // v2: a Slurm-like job (2 GiB, 0.5 used) whose step (no limit of its own: "max") runs us.
  write("cgroup.controllers", "cpu memory");
  write("job/memory.max", "2147483648");
  write("job/memory.current", "536870912");
  write("job/step/memory.max", "max");
  write("job/step/memory.current", "1000");
  EXPECT_EQ(cgroup_memory_left(root_, "0::/job/step\n"), std::optional<uint64_t>(1610612736));
  // A tighter limit on the step wins.
  write("job/step/memory.max", "1001000");
  EXPECT_EQ(cgroup_memory_left(root_, "0::/job/step\n"), std::optional<uint64_t>(1000000));
  // A path that is another namespace's: the mount's own root is read.
  write("memory.max", "4096");
  write("memory.current", "96");
  EXPECT_EQ(cgroup_memory_left(root_, "0::/not/here\n"), std::optional<uint64_t>(4000));
}

TEST_F(HostMemory, CgroupV1IsReadToo) {
  // v1 (this project's own machines): the memory controller's hierarchy, unlimited at the
  // top (9223372036854771712), limited two levels down.
  write("memory/memory.limit_in_bytes", "9223372036854771712");
  write("memory/memory.usage_in_bytes", "8000000000");
  write("memory/process_api/j/memory.limit_in_bytes", "3000000000");
  write("memory/process_api/j/memory.usage_in_bytes", "1000000000");
  const std::string self = "9:name=systemd:/\n4:memory:/process_api/j\n3:cpuset:/\n0::/\n";
  EXPECT_EQ(cgroup_memory_left(root_, self), std::optional<uint64_t>(2000000000));
  // Controllers mounted together ("cpu,memory") are found; none limiting is nothing.
  EXPECT_EQ(cgroup_memory_left(root_, "4:cpu,memory:/process_api/j\n"), std::optional<uint64_t>(2000000000));
  EXPECT_EQ(cgroup_memory_left(root_, "3:cpuset:/\n"), std::nullopt);
}

TEST(HostMemoryReal, ALimitOfThisMachinesCgroupsIsSeen) {
  // A child cgroup of 300 MiB under this machine's memory hierarchy (v1 or v2), a process
  // in it, and what it reads: at most the limit. Skipped where cgroups cannot be made.
  const std::string name = "push-host-memory-test-" + std::to_string(::getpid());
  fs::path dir;
  std::string limit_file;
  for (const auto& [mount, file] :
       {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory", "memory.limit_in_bytes"},
        {"/sys/fs/cgroup", "memory.max"}}) {
    std::error_code ec;
    if (!fs::exists(fs::path(mount) / (file == "memory.max" ? "cgroup.controllers" : file), ec)) continue;
    if (fs::create_directory(fs::path(mount) / name, ec) && fs::exists(fs::path(mount) / name / file, ec)) {
      dir = fs::path(mount) / name;
      limit_file = file;
      break;
    }
    fs::remove(fs::path(mount) / name, ec);
  }
  if (dir.empty()) GTEST_SKIP() << "cannot make a memory cgroup here";
  std::ofstream(dir / limit_file) << (300 << 20) << "\n";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    { std::ofstream(dir / "cgroup.procs") << ::getpid() << "\n"; }
    const uint64_t seen = available_memory_bytes();
    (void)!::write(fds[1], &seen, sizeof(seen));
    ::_exit(0);
  }
  ::close(fds[1]);
  uint64_t seen = 0;
  const ssize_t n = ::read(fds[0], &seen, sizeof(seen));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::error_code ec;
  fs::remove(dir, ec);  // empty again: its only process has exited
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof(seen)));
  EXPECT_LE(seen, uint64_t{300} << 20) << dir;
  EXPECT_GT(seen, uint64_t{200} << 20) << dir;
}

}  // namespace
}  // namespace push::detail
