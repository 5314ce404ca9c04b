// Staged folders published together (push train's --save and --out): both or neither,
// whichever of the two fails, and a read-only target, a mount point or a link to nothing
// is refused before any work.
#include "core/staged_folder.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace push::detail {
namespace {
namespace fs = std::filesystem;

class Staged : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("push_staged_test_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_ / "a", fs::perms::owner_all, fs::perm_options::add, ignored_);
    fs::remove_all(dir_);
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  /// The folder's entries: the targets, and no staging folder left behind.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  void make_old(const std::string& name) {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "f") << "old " << name;
  }
  std::error_code ignored_;
  static std::string anything(const fs::path&) { return ""; }
  /// A check of the target that passes `passes` times, then fails with `why`: the target
  /// changed between two checks. `calls` counts them.
  static StagedFolder::Replaceable passing(int passes, const std::string& why, int& calls) {
    return [passes, why, &calls](const fs::path&) { return ++calls <= passes ? std::string() : why; };
  }
};

TEST_F(Staged, BothArePublishedTogether) {
  make_old("a");
  StagedFolder a(dir_ / "a", "test", "a", anything), b(dir_ / "b", "test", "b", anything);
  a.write("f", "new a");
  b.write("f", "new b");
  StagedFolder::publish_together(a, b);
  EXPECT_EQ(read(dir_ / "a" / "f"), "new a");
  EXPECT_EQ(read(dir_ / "b" / "f"), "new b");
  EXPECT_EQ(names(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(Staged, ASecondTargetThatCannotBePublishedLeavesTheFirstUntouched) {
  make_old("a");
  make_old("b");
  // b became someone else's folder while the run worked: found before a moves.
  int calls = 0;
  StagedFolder a(dir_ / "a", "test", "a", anything);
  StagedFolder b(dir_ / "b", "test", "b", passing(1, "holds 'mine'", calls));
  a.write("f", "new a");
  b.write("f", "new b");
  EXPECT_PUSH_ERROR(StagedFolder::publish_together(a, b), "b '");
  EXPECT_EQ(read(dir_ / "a" / "f"), "old a");
  EXPECT_EQ(read(dir_ / "b" / "f"), "old b");
}

TEST_F(Staged, AFailedSecondSwapPutsTheFirstBack) {
  make_old("a");
  make_old("b");
  // The check before the swaps passes; the one just before b's own swap fails (the
  // target changed in between): a, already swapped, is swapped back.
  int calls = 0;
  StagedFolder a(dir_ / "a", "test", "a", anything);
  StagedFolder b(dir_ / "b", "test", "b", passing(2, "changed meanwhile", calls));
  a.write("f", "new a");
  b.write("f", "new b");
  EXPECT_PUSH_ERROR(StagedFolder::publish_together(a, b), "changed meanwhile");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(read(dir_ / "a" / "f"), "old a");
  EXPECT_EQ(read(dir_ / "b" / "f"), "old b");
}

TEST_F(Staged, ANewFirstTargetIsRemovedAgainWhenTheSecondFails) {
  make_old("b");
  int calls = 0;
  StagedFolder a(dir_ / "a", "test", "a", anything);
  StagedFolder b(dir_ / "b", "test", "b", passing(2, "changed meanwhile", calls));
  a.write("f", "new a");
  EXPECT_PUSH_ERROR(StagedFolder::publish_together(a, b), "changed meanwhile");
  EXPECT_FALSE(fs::exists(dir_ / "a"));
  EXPECT_EQ(read(dir_ / "b" / "f"), "old b");
}

TEST_F(Staged, AReadOnlyTargetIsRefusedBeforeAnyWork) {
  make_old("a");
  fs::permissions(dir_ / "a", fs::perms::owner_write, fs::perm_options::remove);
  EXPECT_PUSH_ERROR(StagedFolder(dir_ / "a", "test", "--out", anything), "is read-only");
  fs::permissions(dir_ / "a", fs::perms::owner_write, fs::perm_options::add);
  // A read-only folder inside it, too: its files could not be deleted after the swap.
  fs::create_directories(dir_ / "a" / "sub");
  fs::permissions(dir_ / "a" / "sub", fs::perms::owner_write, fs::perm_options::remove);
  EXPECT_PUSH_ERROR(StagedFolder(dir_ / "a", "test", "--out", anything), "sub");
  fs::permissions(dir_ / "a" / "sub", fs::perms::owner_write, fs::perm_options::add);
  EXPECT_EQ(names(), std::vector<std::string>{"a"});  // no staging folder left
}

TEST_F(Staged, ANameWithoutRoomForTheStagingSuffixIsNamed) {
  EXPECT_PUSH_ERROR(StagedFolder(dir_ / std::string(240, 'x'), "test", "--out", anything),
                    "its name has 240 characters; at most 223");
  StagedFolder ok(dir_ / std::string(223, 'x'), "test", "--out", anything);
  ok.publish();
  EXPECT_TRUE(fs::is_directory(dir_ / std::string(223, 'x')));
}

TEST_F(Staged, AMountPointOrALinkToNothingIsRefusedBeforeAnyWork) {
  // A link that leads nowhere: the rename at the end would find the name taken (EEXIST).
  fs::create_symlink(dir_ / "nowhere", dir_ / "dangling");
  EXPECT_PUSH_ERROR(StagedFolder(dir_ / "dangling", "test", "--out", anything), "which does not exist");
  // A mount point (a container's volume): renameat2 cannot exchange it (EBUSY). The bind
  // mount is made in a child with its own mount namespace, so none outlives the test.
  make_old("volume");
  const pid_t child = ::fork();
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount((dir_ / "volume").c_str(), (dir_ / "volume").c_str(), nullptr, MS_BIND, nullptr) != 0) {
      ::_exit(77);  // no right to mount here
    }
    try {
      StagedFolder(dir_ / "volume", "test", "--out", anything);
    } catch (const Error& e) {
      ::_exit(std::string(e.what()).find("is a mount point") != std::string::npos ? 0 : 1);
    }
    ::_exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot bind-mount here (needs CAP_SYS_ADMIN)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: another error; 2: no error";
  EXPECT_EQ(names(), (std::vector<std::string>{"dangling", "volume"}));  // no staging folder left
}

}  // namespace
}  // namespace push::detail
