// push launch: N local ranks of one program, with torchrun's environment.
//   push launch --nproc 4 [--master-addr 127.0.0.1] [--master-port 0] -- ./train --epochs 3
// Each output line is prefixed "[rank r] ", a rank's stdout going to the launcher's stdout
// and its stderr to the launcher's stderr. SIGINT/SIGTERM are forwarded to every rank.
// When a rank fails, the others get SIGTERM (SIGKILL 5 s later) and the launcher exits
// with the first failure's code (128 + signal for a rank killed by a signal).
// No process outlives the job: each rank leads its own process group, and when a rank
// exits, whatever is left of its group (background children) is killed; when the
// launcher is killed (even by SIGKILL), its ranks die with it (PR_SET_PDEATHSIG) and a
// watchdog process kills what is left of their groups; a rank that cannot be started (no
// file descriptors, no processes left) stops and reaps the ones already running.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "command.h"

extern char** environ;

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

/// One of a rank's output streams: the read end of its pipe, and what came after the last
/// newline.
struct Stream {
  int fd = -1;
  std::string partial;
};

struct Rank {
  pid_t pid = -1;  // also its process group id
  // Its stdout and stderr, each forwarded to the launcher's own.
  std::array<Stream, 2> streams;
  bool running = false;
  int code = 0;
};

std::string open_files_hint(int err) {
  if (err != EMFILE && err != ENFILE) return "";
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  return " (the launcher needs two per rank; ulimit -n is " + std::to_string(limit.rlim_cur) + ")";
}

/// A forked process that kills what is left of the ranks' process groups when the
/// launcher dies without doing it (SIGKILL). It learns the groups over a pipe; the pipe's
/// end of file, however the launcher went, is its signal. The launcher has other threads
/// (LibTorch's), so after fork the watchdog only makes system calls: no allocation.
class Watchdog {
 public:
  explicit Watchdog(int max_groups) : groups_(static_cast<size_t>(max_groups) + 1, 0) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) fail("cannot create the watchdog's pipe");
    pid_ = fork();
    if (pid_ < 0) {
      const int err = errno;
      close(fds[0]);
      close(fds[1]);
      errno = err;
      fail("cannot fork the watchdog");
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
  ~Watchdog() {
    send(0);  // the launcher cleaned up itself: stand down
    close(to_watchdog_);
    waitpid(pid_, nullptr, 0);
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(pid_t group) { send(group); }
  void forget(pid_t group) { send(-group); }

 private:
  [[noreturn]] static void fail(const char* what) {
    const int err = errno;
    throw std::runtime_error(std::string("cannot start: ") + what + ": " + std::strerror(err) + open_files_hint(err));
  }
  void send(int32_t message) {
    while (write(to_watchdog_, &message, sizeof(message)) < 0 && errno == EINTR) {
    }
  }
  [[noreturn]] void run(int from_launcher) {
    // Terminal signals meant for the launcher must not stop the watchdog.
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    const int null = open("/dev/null", O_RDWR);  // do not hold the launcher's output open
    for (int fd = 0; fd < 3 && null >= 0; ++fd) dup2(null, fd);
    for (int32_t message;;) {
      const ssize_t got = read(from_launcher, &message, sizeof(message));
      if (got < 0 && errno == EINTR) continue;
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

  std::vector<pid_t> groups_;  // sized before the fork
  pid_t pid_ = -1;
  int to_watchdog_ = -1;
};

/// The ranks of the job. Whatever way the launcher leaves (an exception while starting
/// them included), no rank and no process of a rank's group is left running.
class Ranks {
 public:
  Ranks(int n, Watchdog& watchdog) : ranks_(n), watchdog_(watchdog) {}
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  ~Ranks() {
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
  Rank& operator[](int r) { return ranks_[r]; }
  int size() const { return static_cast<int>(ranks_.size()); }

  /// The exit status of rank r if it has exited (reaped), else nothing. Before reaping,
  /// the rest of its process group is killed: the rank's zombie still holds the group id,
  /// so the id cannot have been reused by an unrelated group.
  bool reap(int r, int& status) {
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
  void started(int r) { watchdog_.watch(ranks_[r].pid); }

 private:
  std::vector<Rank> ranks_;
  Watchdog& watchdog_;
};

/// Forks rank r running `program` with `envp`; its stdout and stderr go to two pipes the
/// launcher reads.
void start_rank(Rank& rank, int r, int nproc, char* const* program, char* const* envp) {
  auto fail = [&](const char* what) {
    const int err = errno;
    throw std::runtime_error("cannot start rank " + std::to_string(r) + " of " + std::to_string(nproc) + ": " +
                             what + ": " + std::strerror(err) + open_files_hint(err));
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
}

int usage() {
  std::cerr << "usage: push launch --nproc N [--master-addr A] [--master-port P] -- PROGRAM [ARGS...]\n"
               "  Starts N ranks of PROGRAM with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
               "  MASTER_ADDR, MASTER_PORT set (as torchrun --no-python). --master-port 0 (the\n"
               "  default) picks a free port.\n";
  return 2;
}

/// Writes the complete lines of a rank's stream (all of it with `all`) to `to`, each
/// prefixed with the rank.
void flush_lines(int rank, Stream& s, bool all, std::ostream& to) {
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    to << "[rank " << rank << "] " << s.partial.substr(start, nl - start + 1);
  }
  s.partial.erase(0, start);
  if (all && !s.partial.empty()) {
    to << "[rank " << rank << "] " << s.partial << "\n";
    s.partial.clear();
  }
  to.flush();
}

std::ostream& destination(size_t stream) { return stream == 0 ? std::cout : std::cerr; }

int launch_main(int argc, char** argv) {
  int nproc = -1, port = 0;
  std::string addr = "127.0.0.1";
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) return usage();
    try {
      if (a == "--nproc") nproc = std::stoi(argv[++i]);
      else if (a == "--master-addr") addr = argv[++i];
      else if (a == "--master-port") port = std::stoi(argv[++i]);
      else return usage();
    } catch (const std::exception&) {
      std::cerr << "push launch: " << a << " needs an integer, got '" << argv[i] << "'\n";
      return 2;
    }
  }
  if (nproc < 1 || i >= argc || port < 0 || port > 65535) return usage();
  if (port == 0) port = pick_free_port();

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<char*> program(argv + i, argv + argc);
  program.push_back(nullptr);
  Watchdog watchdog(nproc);
  Ranks ranks(nproc, watchdog);
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string entry(*e);
      const auto key = entry.substr(0, entry.find('='));
      if (key == "RANK" || key == "LOCAL_RANK" || key == "WORLD_SIZE" || key == "LOCAL_WORLD_SIZE" ||
          key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "GROUP_RANK") {
        continue;
      }
      env.push_back(entry);
    }
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"RANK", std::to_string(r)}, {"LOCAL_RANK", std::to_string(r)},
             {"WORLD_SIZE", std::to_string(nproc)}, {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
             {"GROUP_RANK", "0"}, {"MASTER_ADDR", addr}, {"MASTER_PORT", std::to_string(port)}}) {
      env.push_back(k + "=" + v);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    start_rank(ranks[r], r, nproc, program.data(), envp.data());
    ranks.started(r);
  }

  int first_failure = 0;
  int forwarded = 0;
  std::chrono::steady_clock::time_point kill_at{};
  auto stop_all = [&](int sig) {
    for (int r = 0; r < nproc; ++r) {
      if (ranks[r].running) kill(-ranks[r].pid, sig);
    }
    if (kill_at == std::chrono::steady_clock::time_point{}) {
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
  };
  for (;;) {
    if (g_signal && !forwarded) {
      forwarded = g_signal;
      stop_all(forwarded);
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<int, size_t>> owners;  // (rank, stream)
    for (int r = 0; r < nproc; ++r) {
      for (size_t k = 0; k < ranks[r].streams.size(); ++k) {
        if (ranks[r].streams[k].fd < 0) continue;
        fds.push_back({ranks[r].streams[k].fd, POLLIN, 0});
        owners.emplace_back(r, k);
      }
    }
    if (!fds.empty() && poll(fds.data(), fds.size(), 50) > 0) {
      for (size_t k = 0; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const auto [r, which] = owners[k];
        auto& stream = ranks[r].streams[which];
        char buffer[8192];
        const ssize_t got = read(stream.fd, buffer, sizeof(buffer));
        if (got > 0) {
          stream.partial.append(buffer, static_cast<size_t>(got));
          flush_lines(r, stream, false, destination(which));
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
          flush_lines(r, stream, true, destination(which));
          close(stream.fd);
          stream.fd = -1;
        }
      }
    } else if (fds.empty()) {
      usleep(50 * 1000);
    }
    bool any_running = false;
    for (int r = 0; r < nproc; ++r) {
      auto& rank = ranks[r];
      int status = 0;
      if (ranks.reap(r, status)) {
        rank.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (rank.code != 0 && first_failure == 0 && !forwarded) {
          first_failure = rank.code;
          std::cerr << "push launch: rank " << r
                    << (WIFEXITED(status) ? " exited with code " : " was killed by signal ")
                    << (WIFEXITED(status) ? rank.code : WTERMSIG(status))
                    << "; stopping the other ranks\n";
          stop_all(SIGTERM);
        }
      }
      any_running |= rank.running;
    }
    if (!any_running) break;
    if (kill_at != std::chrono::steady_clock::time_point{} && std::chrono::steady_clock::now() > kill_at) {
      stop_all(SIGKILL);
    }
  }
  for (int r = 0; r < nproc; ++r) {
    for (size_t which = 0; which < ranks[r].streams.size(); ++which) {
      auto& stream = ranks[r].streams[which];
      if (stream.fd < 0) continue;
      char buffer[8192];
      for (ssize_t got; (got = read(stream.fd, buffer, sizeof(buffer))) > 0;) {
        stream.partial.append(buffer, static_cast<size_t>(got));
      }
      flush_lines(r, stream, true, destination(which));
      close(stream.fd);
      stream.fd = -1;
    }
  }
  if (forwarded) return 128 + forwarded;
  return first_failure;
}

}  // namespace

PUSH_CLI_COMMAND(launch, "start N local ranks of a program for push::dist (like torchrun --no-python)",
                 launch_main);
