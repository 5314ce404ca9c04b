// Starting, reaping and cleaning up after the ranks of push launch.
#include "launch_ranks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/files.h"

namespace push::cli {
namespace {

std::string open_files_hint(int err) {
  if (err != EMFILE && err != ENFILE) return "";
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  return " (the launcher needs two per rank; ulimit -n is " + std::to_string(limit.rlim_cur) + ")";
}

[[noreturn]] void fail_to_start(const char* what) {
  const int err = errno;
  throw std::runtime_error(std::string("cannot start: ") + what + ": " + std::strerror(err) + open_files_hint(err));
}

}  // namespace

Watchdog::Watchdog(int max_groups) : groups_(static_cast<size_t>(max_groups) + 1, 0) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) fail_to_start("cannot create the watchdog's pipe");
  pid_ = fork();
  if (pid_ < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    errno = err;
    fail_to_start("cannot fork the watchdog");
  }
  if (pid_ == 0) {
    // A group of its own: `kill -- -PGID` aimed at the launcher must not take the
    // watchdog along before it has cleaned up the ranks' groups.
    setpgid(0, 0);
    close(fds[1]);
    run(fds[0]);
  }
  close(fds[0]);
  to_watchdog_ = fds[1];
}

Watchdog::~Watchdog() {
  send(0);
  close(to_watchdog_);
  waitpid(pid_, nullptr, 0);
}

void Watchdog::send(int32_t message) {
  // A failed write leaves the watchdog what it knew: it still kills those groups, and the
  // launcher's own cleanup covers the rest.
  push::detail::write_full(to_watchdog_, &message, sizeof(message));
}

void Watchdog::run(int from_launcher) {
  // Terminal signals meant for the launcher must not stop the watchdog.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  const int null = open("/dev/null", O_RDWR);  // do not hold the launcher's output open
  for (int fd = 0; fd < 3 && null >= 0; ++fd) dup2(null, fd);
  for (int32_t message;;) {
    const ssize_t got = push::detail::read_full(from_launcher, &message, sizeof(message));
    if (got != static_cast<ssize_t>(sizeof(message))) break;  // the launcher is gone
    if (message == 0) _exit(0);
    for (auto& g : groups_) {
      if (message > 0 && g == 0) {
        g = message;
        break;
      }
      if (message < 0 && g == -message) {
        g = 0;
        break;
      }
    }
  }
  for (pid_t g : groups_) {
    if (g > 0) kill(-g, SIGKILL);
  }
  _exit(0);
}

Ranks::Ranks(int n) : watchdog_(n), ranks_(n) {}

Ranks::~Ranks() {
  for (auto& r : ranks_) {
    if (r.running) {
      kill(-r.pid, SIGKILL);
      waitpid(r.pid, nullptr, 0);
      watchdog_.forget(r.pid);
      r.running = false;
    }
    for (auto& stream : r.streams) {
      if (stream.fd >= 0) close(stream.fd);
    }
  }
}

void Ranks::start(int r, char* const* program, char* const* envp) {
  Rank& rank = ranks_[r];
  auto fail = [&](const char* what) {
    const int err = errno;
    throw std::runtime_error("cannot start rank " + std::to_string(r) + " of " + std::to_string(size()) + ": " + what +
                             ": " + std::strerror(err) + open_files_hint(err));
  };
  int fds[2], err_fds[2];
  // Close-on-exec: other ranks must not inherit this rank's pipes.
  if (pipe2(fds, O_CLOEXEC) != 0) fail("cannot create its output pipe");
  if (pipe2(err_fds, O_CLOEXEC) != 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    errno = err;
    fail("cannot create its error pipe");
  }
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    for (int fd : {fds[0], fds[1], err_fds[0], err_fds[1]}) close(fd);
    errno = err;
    fail("fork failed");
  }
  if (pid == 0) {
    setpgid(0, 0);  // signals reach the rank's whole process tree through its group
    // Die with the launcher, even when it is SIGKILLed and cannot stop us itself.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    dup2(fds[1], STDOUT_FILENO);
    dup2(err_fds[1], STDERR_FILENO);
    execvpe(program[0], program, envp);
    std::fprintf(stderr, "push launch: cannot run %s: %s\n", program[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  close(err_fds[1]);
  rank.pid = pid;
  rank.streams[0].fd = fds[0];
  rank.streams[1].fd = err_fds[0];
  for (const auto& stream : rank.streams) fcntl(stream.fd, F_SETFL, fcntl(stream.fd, F_GETFL) | O_NONBLOCK);
  rank.running = true;
  watchdog_.watch(pid);
}

bool Ranks::reap(int r, int& status) {
  Rank& rank = ranks_[r];
  siginfo_t info{};
  if (!rank.running || waitid(P_PID, rank.pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != rank.pid) {
    return false;
  }
  kill(-rank.pid, SIGKILL);
  if (waitpid(rank.pid, &status, 0) != rank.pid) return false;
  watchdog_.forget(rank.pid);
  rank.running = false;
  return true;
}

}  // namespace push::cli
