// `push launch` leaves no process behind on any path: a rank's background children, a
// SIGKILLed launcher, a launcher that cannot start every rank. The test process makes
// itself a child subreaper, so whatever the launcher orphans is re-parented to it, where
// the test can see it (and reap it: a container's PID 1 may never reap zombies).
#include <gtest/gtest.h>

#include <c10/util/StringUtil.h>

#include "poll_real.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {
using namespace std::chrono_literals;

/// While alive, orphans of our descendants become our children. On exit, kills and reaps
/// any that are left, so a failing test leaves nothing running.
class Subreaper {
 public:
  Subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~Subreaper() {
    for (pid_t pid : children_left()) kill(pid, SIGKILL);
    while (waitpid(-1, nullptr, 0) > 0) {
    }
    prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

  /// Reaps every child that has exited, waiting up to `patience` for all to be gone;
  /// returns the pids of children still running.
  std::set<pid_t> reap_all(std::chrono::milliseconds patience) {
    const bool none_left = push::testing::poll_real(
        [&] {
          for (;;) {
            int status = 0;
            const pid_t pid = waitpid(-1, &status, WNOHANG);
            if (pid <= 0) return pid < 0 && errno == ECHILD;
            reaped_.insert(pid);
          }
        },
        patience);
    return none_left ? std::set<pid_t>{} : children_left();
  }
  bool reaped(pid_t pid) const { return reaped_.count(pid) > 0; }
  size_t reaped_count() const { return reaped_.size(); }

 private:
  static std::set<pid_t> children_left() {
    std::set<pid_t> pids;
    FILE* f = std::fopen(("/proc/self/task/" + std::to_string(getpid()) + "/children").c_str(), "r");
    if (f == nullptr) return pids;
    for (int pid; std::fscanf(f, "%d", &pid) == 1;) pids.insert(pid);
    std::fclose(f);
    return pids;
  }
  std::set<pid_t> reaped_;
};

struct Launched {
  pid_t pid = -1;
  int out = -1;  // the launcher's stdout and stderr
};

/// Starts `push launch ARGS` with its output on a pipe; `max_fds` > 0 caps its open files.
Launched start_launcher(const std::vector<std::string>& args, int max_fds = 0) {
  std::vector<std::string> argv = {PUSH_CLI_PATH, "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargs;
  for (auto& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    if (max_fds > 0) {
      const rlimit cap{static_cast<rlim_t>(max_fds), static_cast<rlim_t>(max_fds)};
      setrlimit(RLIMIT_NOFILE, &cap);
    }
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

/// Reads the launcher's output until `lines` lines have arrived, it closes, or `patience` passes.
std::string read_output(int fd, int lines, std::chrono::milliseconds patience) {
  std::string output;
  const auto end = std::chrono::steady_clock::now() + patience;
  char buffer[4096];
  while (std::count(output.begin(), output.end(), '\n') < lines && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got <= 0) break;
    output.append(buffer, static_cast<size_t>(got));
  }
  return output;
}

std::vector<pid_t> pids_after(const std::string& output, const std::string& tag) {
  std::vector<pid_t> pids;
  for (size_t at = output.find(tag); at != std::string::npos; at = output.find(tag, at + 1)) {
    pids.push_back(static_cast<pid_t>(std::atoi(output.c_str() + at + tag.size())));
  }
  return pids;
}

/// The launcher's exit status as a code (128 + signal when killed); -1 if it hangs.
int wait_launcher(pid_t pid, std::chrono::milliseconds patience) {
  int status = 0;
  if (!push::testing::poll_real([&] { return waitpid(pid, &status, WNOHANG) != 0; }, patience)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(DistLaunch, BackgroundChildrenOfRanksDoNotOutliveTheJob) {
  Subreaper reaper;
  auto launcher = start_launcher({"--nproc", "2", "--", "/bin/sh", "-c", "sleep 60 & echo bg=$!; sleep 0.2; exit 0"});
  const std::string output = read_output(launcher.out, 2, 20s);
  EXPECT_EQ(wait_launcher(launcher.pid, 20s), 0) << output;
  close(launcher.out);
  const auto background = pids_after(output, "bg=");
  ASSERT_EQ(background.size(), 2u) << output;
  EXPECT_EQ(reaper.reap_all(5s), std::set<pid_t>{}) << "survivors of the job: " << output;
  for (pid_t pid : background) EXPECT_TRUE(reaper.reaped(pid)) << pid;
}

TEST(DistLaunch, SigkilledLauncherTakesItsRanksAlong) {
  Subreaper reaper;
  auto launcher =
      start_launcher({"--nproc", "3", "--", "/bin/sh", "-c", "sleep 60 & echo bg=$!; echo pid=$$; exec sleep 60"});
  const std::string output = read_output(launcher.out, 6, 20s);
  const auto ranks = pids_after(output, "pid="), background = pids_after(output, "bg=");
  ASSERT_EQ(ranks.size(), 3u) << output;
  ASSERT_EQ(background.size(), 3u) << output;
  kill(launcher.pid, SIGKILL);
  EXPECT_EQ(wait_launcher(launcher.pid, 10s), 128 + SIGKILL);
  close(launcher.out);
  EXPECT_EQ(reaper.reap_all(5s), std::set<pid_t>{}) << "ranks outlived their launcher";
  for (pid_t pid : ranks) EXPECT_TRUE(reaper.reaped(pid)) << pid;
  for (pid_t pid : background) EXPECT_TRUE(reaper.reaped(pid)) << pid;
}

TEST(DistLaunch, TooFewFileDescriptorsIsAClearErrorAndNoRankIsOrphaned) {
  Subreaper reaper;
  // (open files, ranks): 3 are stdin/out/err; the launcher needs two pipes per rank.
  for (auto [max_fds, nproc] : {std::pair{8, 8}, {12, 8}, {16, 20}}) {
    auto launcher = start_launcher({"--nproc", std::to_string(nproc), "--", "/bin/sh", "-c", "exec sleep 60"}, max_fds);
    const std::string output = read_output(launcher.out, 1000, 20s);
    close(launcher.out);
    const int code = wait_launcher(launcher.pid, 20s);
    EXPECT_NE(code, 0) << output;
    EXPECT_NE(code, -1) << "the launcher hung: " << output;
    EXPECT_NE(output.find("Too many open files"), std::string::npos) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
    // The launcher has reaped every rank it started: nothing was re-parented to us.
    const size_t before = reaper.reaped_count();
    EXPECT_EQ(reaper.reap_all(2s), std::set<pid_t>{}) << max_fds << " files: ranks were orphaned";
    EXPECT_EQ(reaper.reaped_count(), before) << max_fds << " files: ranks were orphaned";
  }
}

TEST(DistLaunch, ARankStillRunningAGraceAfterAnotherExitedIsStoppedAndNamed) {
  Subreaper reaper;
  // Rank 1 stops itself (SIGSTOP) near the end; rank 0 finishes with 0.
  auto launcher = start_launcher({"--nproc", "2", "--grace", "2", "--", "/bin/sh", "-c",
                                  "if [ \"$RANK\" = 1 ]; then kill -STOP $$; fi; echo rank $RANK done"});
  const auto start = std::chrono::steady_clock::now();
  const int code = wait_launcher(launcher.pid, 60s);
  const std::string output = read_output(launcher.out, 1000, 5s);
  close(launcher.out);
  EXPECT_EQ(code, 1) << output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << output;  // 2 s of grace, 5 s to SIGKILL
  EXPECT_NE(output.find("rank 0 done"), std::string::npos) << output;
  EXPECT_NE(output.find("rank 1 still ran 2 s after rank 0 exited (stopped or hung?); stopping it"), std::string::npos)
      << output;
  EXPECT_TRUE(reaper.reap_all(10s).empty());
}

TEST(DistLaunch, AnErrorEveryRankFindsIsOneLine) {
  // Every rank of `push train --nproc` meets the same bad input and says so, in a push
  // program's one-line form: the user reads it once, with no second line from the launcher.
  auto launcher =
      start_launcher({"--nproc", "3", "--", "/bin/sh", "-c", "echo 'push train: the same bad input' >&2; exit 1"});
  const int code = wait_launcher(launcher.pid, 60s);
  const std::string output = read_output(launcher.out, 1000, 5s);
  close(launcher.out);
  EXPECT_EQ(code, 1) << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  EXPECT_NE(output.find("] push train: the same bad input\n"), std::string::npos) << output;
  // A rank that fails without saying why is still named by the launcher.
  auto silent = start_launcher({"--nproc", "2", "--", "/bin/sh", "-c", "exit 3"});
  EXPECT_EQ(wait_launcher(silent.pid, 60s), 3);
  const std::string said = read_output(silent.out, 1000, 5s);
  close(silent.out);
  EXPECT_NE(said.find("exited with code 3; stopping the other ranks"), std::string::npos) << said;
}

TEST(DistLaunch, BadNumbersAndAMalformedSecretAreOneLineBeforeAnyRank) {
  // Each is named in one line, exit status 2, and nothing starts (the rank would print).
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--nproc", "0"}, "--nproc: '0' must be a whole number from 1 to 1024"},
      {{"--nproc", "2x"}, "--nproc: '2x' must be a whole number from 1 to 1024"},
      {{"--master-port", "70000"}, "--master-port: '70000' must be a whole number from 0 to 65535"},
      {{}, "--nproc N is required"},
      {{"--frob", "2"}, "unknown option '--frob'"},
      {{"--nproc", "2", "--grace", "0"}, "--grace: '0' must be a whole number from 1 to 86400"},
      {{"--nproc", "2", "--nproc", "3"}, "--nproc is given twice: give it once"},
  };
  for (const auto& [args, needle] : cases) {
    auto all = args;
    for (const char* word : {"--", "/bin/echo", "a rank ran"}) all.emplace_back(word);
    auto launcher = start_launcher(all);
    const std::string output = read_output(launcher.out, 1000, 20s);
    close(launcher.out);
    EXPECT_EQ(wait_launcher(launcher.pid, 20s), 2) << output;
    EXPECT_NE(output.find(needle), std::string::npos) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
  // A program that cannot run is said once, by the launcher, before any rank starts
  // (execvp's exit status 127), however many ranks were asked for.
  const std::string text_file =
      c10::str(std::filesystem::temp_directory_path().string(), "/push-launch-text-", ::getpid());
  std::ofstream(text_file) << "not a program\n";
  std::filesystem::permissions(text_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::pair<std::string, std::string> programs[] = {
      {"no_such_program_for_push", "cannot run no_such_program_for_push: no such program in PATH"},
      {"/no/such/program", "cannot run /no/such/program: No such file or directory"},
      {"/tmp", "cannot run /tmp: it is a folder"},
      {text_file, "cannot run " + text_file + ": it is not executable"},
  };
  for (const auto& [program, needle] : programs) {
    auto launcher = start_launcher({"--nproc", "3", "--", program});
    const std::string output = read_output(launcher.out, 1000, 20s);
    close(launcher.out);
    EXPECT_EQ(wait_launcher(launcher.pid, 20s), 127) << output;
    EXPECT_NE(output.find("push launch: " + needle), std::string::npos) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
  std::filesystem::remove(text_file);
  ::setenv("PUSH_JOB_SECRET", "not-hex", 1);
  auto launcher = start_launcher({"--nproc", "2", "--", "/bin/echo", "a rank ran"});
  ::unsetenv("PUSH_JOB_SECRET");
  const std::string output = read_output(launcher.out, 1000, 20s);
  close(launcher.out);
  EXPECT_EQ(wait_launcher(launcher.pid, 20s), 2) << output;
  EXPECT_NE(output.find("PUSH_JOB_SECRET must be 64 hexadecimal digits (32 random bytes), got 7 characters"),
            std::string::npos)
      << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
}

}  // namespace

TEST(DistLaunch, CarriageReturnUpdatesAreForwardedAsTheyComeAndLongLinesInPieces) {
  // A progress bar redraws its line with '\r': each redraw reaches the launcher's output while
  // the rank still runs (it sleeps before its last line).
  auto l =
      start_launcher({"--nproc", "1", "--", "/bin/sh", "-c", "printf 'bar 1\\rbar 2\\r'; sleep 3; printf 'done\\n'"});
  // Read until the second redraw (at most 10 s: a sanitizer build starts slowly); it must
  // come before the rank's last line, 3 s later.
  std::string early;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (early.find("bar 2\r") == std::string::npos && std::chrono::steady_clock::now() < until) {
    pollfd p{l.out, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buffer[256];
    const ssize_t got = read(l.out, buffer, sizeof(buffer));
    if (got <= 0) break;
    early.append(buffer, static_cast<size_t>(got));
  }
  EXPECT_NE(early.find("[rank 0] bar 1\r[rank 0] bar 2\r"), std::string::npos) << early;
  EXPECT_EQ(early.find("done"), std::string::npos) << early;
  const std::string rest = read_output(l.out, 1, 10s);
  EXPECT_NE(rest.find("[rank 0] done\n"), std::string::npos) << rest;
  EXPECT_EQ(wait_launcher(l.pid, 10s), 0);
  close(l.out);
  // 200 KiB without a newline: forwarded in pieces before the rank ends, not held whole.
  auto big = start_launcher({"--nproc", "1", "--", "/bin/sh", "-c", "head -c 204800 /dev/zero | tr '\\0' x; sleep 3"});
  const std::string pieces = read_output(big.out, 3, 10s);
  EXPECT_EQ(std::count(pieces.begin(), pieces.end(), '\n'), 3) << pieces.size() << " bytes";
  int status = 0;
  EXPECT_EQ(::waitpid(big.pid, &status, WNOHANG), 0) << "the pieces came only once the rank ended";
  EXPECT_EQ(wait_launcher(big.pid, 10s), 0);
  close(big.out);
}

TEST(DistLaunch, EachOfSeveralHostsStartsItsRanksOfOneJob) {
  // The secret comes from the environment the launchers share; none at first.
  const char* had = std::getenv("PUSH_JOB_SECRET");
  const std::string saved = had ? had : "";
  unsetenv("PUSH_JOB_SECRET");
  const std::vector<std::string> node1 = {"--nproc",       "2",         "--nnodes",      "2",    "--node-rank", "1",
                                          "--master-addr", "192.0.2.1", "--master-port", "29999"};
  auto with = [&](std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  const std::vector<std::string> program = {
      "--", "/bin/sh", "-c", "echo env=$RANK,$WORLD_SIZE,$LOCAL_RANK,$LOCAL_WORLD_SIZE,$GROUP_RANK,$PUSH_JOB_ID"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {with(node1, program), "--nnodes 2 needs PUSH_JOB_SECRET in the environment"},
      {with({"--nproc", "2", "--nnodes", "2", "--node-rank", "1", "--master-port", "29999"}, program),
       "--nnodes 2 needs --master-addr"},
      {with({"--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr", "192.0.2.1", "--master-port", "1"},
            program),
       "--node-rank 2 is not in 0..1"},
      {with({"--nproc", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "1"}, program),
       "not the loopback 127.0.0.1"},
  };
  for (const auto& [args, needle] : refused) {
    const auto l = start_launcher(args);
    const std::string out = read_output(l.out, 1, 5s);
    close(l.out);
    EXPECT_EQ(wait_launcher(l.pid, 5s), 2) << out;
    EXPECT_NE(out.find(needle), std::string::npos) << out;
  }
  // Node 1 of 2, two ranks each: ranks 2 and 3 of 4, node 0's address in the job id.
  setenv("PUSH_JOB_SECRET", std::string(64, 'a').c_str(), 1);
  const auto l = start_launcher(with(node1, program));
  const std::string out = read_output(l.out, 2, 20s);
  close(l.out);
  EXPECT_EQ(wait_launcher(l.pid, 20s), 0) << out;
  EXPECT_NE(out.find("[rank 2] env=2,4,0,2,1,push-launch:192.0.2.1:29999"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 3] env=3,4,1,2,1,push-launch:192.0.2.1:29999"), std::string::npos) << out;
  if (had) {
    setenv("PUSH_JOB_SECRET", saved.c_str(), 1);
  } else {
    unsetenv("PUSH_JOB_SECRET");
  }
}
