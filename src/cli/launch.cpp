// push launch: N local ranks of one program, with torchrun's environment; on several hosts,
// the same command on each with --nnodes and its --node-rank.
//   push launch --nproc 4 [--master-addr 127.0.0.1] [--master-port 0] -- ./train --epochs 3
//   push launch --nproc 4 --nnodes 2 --node-rank K --master-addr HOST0 --master-port P -- ...
// Each output line is prefixed "[rank r] ", a rank's stdout going to the launcher's stdout
// and its stderr to the launcher's stderr. SIGINT/SIGTERM are forwarded to every rank.
// When a rank fails, the others get SIGTERM (SIGKILL 5 s later) and the launcher exits
// with the first failure's code (128 + signal for a rank killed by a signal). No process
// outlives the job (launch_ranks.h).
#include <push/dist/free_port.h>
#include <push/dist/world.h>

#include <c10/util/StringUtil.h>

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "command.h"
#include "core/clock.h"
#include "core/user_text.h"
#include "launch_nodes.h"
#include "launch_ranks.h"

extern char** environ;

namespace push::cli {
namespace {

using push::detail::Clock;

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

struct LaunchArgs {
  int nproc = -1, port = 0, nnodes = 1, node_rank = 0;
  int grace = 120;  // seconds the other ranks get once one has exited
  std::string addr = "127.0.0.1";
  bool addr_given = false;
  std::vector<char*> program;                            // argv of the program, null-terminated
  std::vector<std::pair<std::string, std::string>> job;  // PUSH_JOB_ID, PUSH_JOB_SECRET
};

int usage() {
  std::cerr
      << "usage: push launch --nproc N [--nnodes M --node-rank K] [--master-addr A] [--master-port P] "
         "[--grace S] -- PROGRAM [ARGS...]\n"
         "  Starts N ranks of PROGRAM with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
         "  MASTER_ADDR, MASTER_PORT set (as torchrun --no-python), and a fresh PUSH_JOB_ID and\n"
         "  PUSH_JOB_SECRET unless set already. --master-port 0 (the default) picks a free port.\n"
         "  On M hosts: the same command on each, --node-rank 0 to M-1, --master-addr the address of\n"
         "  node 0, a --master-port, and one PUSH_JOB_SECRET (64 hex digits) in every host's environment.\n"
         "  Once a rank has exited, the others get --grace S seconds (default 120) to finish, then are stopped.\n";
  return 2;
}

/// Why `program` cannot be run (as execvp would look for it: a path as it is, a bare name in
/// PATH), or "" when it can: said once by the launcher, not once by each rank.
std::string program_refusal(const std::string& program) {
  // Why the file at `path` cannot be run, or nullptr when it can.
  auto refusal = [](const std::string& path) -> const char* {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
    if (S_ISDIR(st.st_mode)) return "it is a folder";
    if (!S_ISREG(st.st_mode)) return "it is not a regular file";
    if (::access(path.c_str(), X_OK) != 0) return "it is not executable (chmod +x?)";
    return nullptr;
  };
  const std::string shown = push::detail::printable(program);
  if (program.find('/') != std::string::npos) {
    const char* why = refusal(program);
    return why == nullptr ? "" : c10::str("cannot run ", shown, ": ", why);
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t at = 0; at <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::string dir = end > at ? dirs.substr(at, end - at) : ".";
    if (refusal(dir + "/" + program) == nullptr) return "";
    at = end + 1;
  }
  return c10::str("cannot run ", shown, ": no such program in PATH (give its path, e.g. ./", shown, ")");
}

/// Fills `a` from the command line; returns the exit status when the launcher ends here
/// (2: a usage error; 127: no such program).
std::optional<int> parse_launch_args(int argc, char** argv, LaunchArgs& a) {
  int i = 1;
  std::set<std::string> given;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) return usage();
    if (!given.insert(arg).second) {
      std::cerr << "push launch: " << push::detail::printable(arg) << " is given twice: give it once\n";
      return 2;
    }
    // Whole numbers in their ranges, read as push train reads them (core/user_text.h):
    // "2x" or "0" is named, not taken for 2 or shown the usage text alone.
    auto whole = [&](const char* what, int64_t lo, int64_t hi, int& into) {
      const auto v = push::detail::parse_whole(argv[i + 1], lo, hi);
      if (!v) {
        std::cerr << "push launch: " << what << ": '" << push::detail::printable(argv[i + 1])
                  << "' must be a whole number from " << lo << " to " << hi << "\n";
        return false;
      }
      into = static_cast<int>(*v);
      ++i;
      return true;
    };
    bool ok = true;
    if (arg == "--nproc") {
      ok = whole("--nproc", 1, 1024, a.nproc);
    } else if (arg == "--nnodes") {
      ok = whole("--nnodes", 1, 1024, a.nnodes);
    } else if (arg == "--node-rank") {
      ok = whole("--node-rank", 0, 1023, a.node_rank);
    } else if (arg == "--master-addr") {
      a.addr = argv[++i];
      a.addr_given = true;
    } else if (arg == "--master-port") {
      ok = whole("--master-port", 0, 65535, a.port);
    } else if (arg == "--grace") {
      ok = whole("--grace", 1, 86400, a.grace);
    } else {
      std::cerr << "push launch: unknown option '" << push::detail::printable(arg)
                << "' (push launch --nproc N [--nnodes M --node-rank K --master-addr A --master-port P --grace S] -- "
                   "PROGRAM)\n";
      return 2;
    }
    if (!ok) return 2;
  }
  if (i >= argc) return usage();
  if (a.nproc < 1) {
    std::cerr << "push launch: --nproc N is required: how many ranks to start on this host\n";
    return 2;
  }
  for (const auto& why : {nodes_refusal(a.nnodes, a.node_rank, a.addr_given ? a.addr : "", a.port), secret_refusal()}) {
    if (!why.empty()) {
      std::cerr << "push launch: " << why << "\n";
      return 2;
    }
  }
  if (const auto why = program_refusal(argv[i]); !why.empty()) {
    std::cerr << "push launch: " << why << "\n";
    return 127;
  }
  a.program.assign(argv + i, argv + argc);
  a.program.push_back(nullptr);
  return std::nullopt;
}

/// The launcher's environment with rank r's torchrun variables in place of any it had.
std::vector<std::string> rank_environment(int r, const LaunchArgs& a) {
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
  // One job id and one secret for all the ranks (docs/distributed.md, "Who gets in"),
  // unless the user gave them.
  for (const auto& [k, v] : a.job) {
    if (std::getenv(k.c_str()) == nullptr) env.push_back(k + "=" + v);
  }
  for (auto [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"RANK", std::to_string(a.node_rank * a.nproc + r)},
                                                        {"LOCAL_RANK", std::to_string(r)},
                                                        {"WORLD_SIZE", std::to_string(a.nnodes * a.nproc)},
                                                        {"LOCAL_WORLD_SIZE", std::to_string(a.nproc)},
                                                        {"GROUP_RANK", std::to_string(a.node_rank)},
                                                        {"MASTER_ADDR", a.addr},
                                                        {"MASTER_PORT", std::to_string(a.port)}}) {
    env.push_back(k + "=" + v);
  }
  return env;
}

/// Writes the complete lines of a rank's stream (all of it with `all`) to `to`, each
/// prefixed with the rank.
/// A line that never ends (or a very long one) is forwarded in pieces of this size.
constexpr size_t kLongestLine = 64 << 10;

/// The error lines of push programs ("push train: ...") already forwarded from some rank:
/// every rank of `push train --nproc` finds the same bad input, and says so once.
std::set<std::string>& errors_said() {
  static std::set<std::string> said;
  return said;
}

/// Writes the complete lines of a rank's stream (all of it with `all`) to `to`, each
/// prefixed with the rank. A carriage return ends a line too (a progress bar redraws its
/// line with one): it is forwarded as it comes, so the bar moves in the launcher's terminal.
/// On stderr (`errors`), a push program's error line that another rank said already is
/// left out.
void flush_lines(int rank, Stream& s, bool all, std::ostream& to, bool errors) {
  size_t start = 0;
  for (size_t end; (end = s.partial.find_first_of("\n\r", start)) != std::string::npos; start = end + 1) {
    if (s.partial[end] == '\r' && end == start) {
      to << '\r';  // an empty redraw: nothing to label
      continue;
    }
    const std::string_view line = std::string_view(s.partial).substr(start, end - start);
    if (errors && s.partial[end] == '\n' && line.rfind("push ", 0) == 0 && line.find(": ") != std::string_view::npos) {
      s.said = line;
      if (!errors_said().insert(s.said).second) continue;
    }
    to << "[rank " << rank << "] " << std::string_view(s.partial).substr(start, end - start + 1);
  }
  s.partial.erase(0, start);
  if (!s.partial.empty() && (all || s.partial.size() >= kLongestLine)) {
    to << "[rank " << rank << "] " << s.partial << "\n";
    s.partial.clear();
  }
  to.flush();
}

std::ostream& destination(size_t stream) { return stream == 0 ? std::cout : std::cerr; }

/// One read of what a rank's stream holds, appended to its partial line: read(2)'s result.
ssize_t read_some(Stream& s) {
  char buffer[8192];
  const ssize_t got = read(s.fd, buffer, sizeof(buffer));
  if (got > 0) s.partial.append(buffer, static_cast<size_t>(got));
  return got;
}

/// Forwards what the ranks wrote within `timeout`, labelled with their job ranks (the
/// first is `first`); a stream that ended (or failed) is flushed and closed.
void forward_output(Ranks& ranks, int first, std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, size_t>> owners;  // (rank, stream)
  for (int r = 0; r < ranks.size(); ++r) {
    for (size_t k = 0; k < ranks[r].streams.size(); ++k) {
      if (ranks[r].streams[k].fd < 0) continue;
      fds.push_back({ranks[r].streams[k].fd, POLLIN, 0});
      owners.emplace_back(r, k);
    }
  }
  if (fds.empty()) {
    // Every stream has ended, not every rank: wait for them as poll would have.
    Clock::sleep_for(timeout);
    return;
  }
  if (poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
  for (size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const auto [r, which] = owners[k];
    auto& stream = ranks[r].streams[which];
    const ssize_t got = read_some(stream);
    if (got > 0) {
      flush_lines(first + r, stream, false, destination(which), which == 1);
    } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
      flush_lines(first + r, stream, true, destination(which), which == 1);
      close(stream.fd);
      stream.fd = -1;
    }
  }
}

/// Forwards what rank `r` has written so far without waiting (it has exited; a child of
/// its may hold its streams open).
void forward_ready(Ranks& ranks, int r, int first) {
  for (size_t which = 0; which < ranks[r].streams.size(); ++which) {
    auto& stream = ranks[r].streams[which];
    for (pollfd p{stream.fd, POLLIN, 0}; stream.fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLIN);) {
      if (read_some(stream) <= 0) break;
      flush_lines(first + r, stream, false, destination(which), which == 1);
    }
  }
}

/// Forwards what is left in the ranks' streams once every rank has exited, and closes them.
void drain_output(Ranks& ranks, int first) {
  for (int r = 0; r < ranks.size(); ++r) {
    for (size_t which = 0; which < ranks[r].streams.size(); ++which) {
      auto& stream = ranks[r].streams[which];
      if (stream.fd < 0) continue;
      while (read_some(stream) > 0) {
      }
      flush_lines(first + r, stream, true, destination(which), which == 1);
      close(stream.fd);
      stream.fd = -1;
    }
  }
}

/// Forwards the ranks' output until every rank has exited, and stops them all when one
/// fails, when the launcher is signalled, or when ranks still run `grace` after one exited
/// (a rank stopped or hung near the end would otherwise hold the launcher forever).
/// Returns the launcher's exit status. `first`: the job rank of local rank 0.
int supervise(Ranks& ranks, int first, std::chrono::seconds grace) {
  int first_failure = 0;
  int forwarded = 0;  // the signal the launcher got and passed on
  std::optional<Clock::time_point> kill_at;
  std::optional<std::pair<int, Clock::time_point>> first_exit;  // which rank, and when
  bool outlived = false;
  auto stop_all = [&](int sig) {
    for (int r = 0; r < ranks.size(); ++r) {
      if (ranks[r].running) kill(-ranks[r].pid, sig);
    }
    if (!kill_at) kill_at = Clock::now() + std::chrono::seconds(5);
  };
  for (;;) {
    if (g_signal && !forwarded) {
      forwarded = g_signal;
      stop_all(forwarded);
    }
    forward_output(ranks, first, std::chrono::milliseconds(50));
    bool any_running = false;
    for (int r = 0; r < ranks.size(); ++r) {
      int status = 0;
      if (ranks.reap(r, status)) {
        if (!first_exit) first_exit = std::make_pair(first + r, Clock::now());
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != 0 && first_failure == 0 && !forwarded && !outlived) {
          first_failure = code;
          // A rank that said why it failed (a push program's error line) needs no second line.
          forward_ready(ranks, r, first);
          if (!WIFEXITED(status) || ranks[r].streams[1].said.empty()) {
            std::cerr << "push launch: rank " << first + r
                      << (WIFEXITED(status) ? " exited with code " : " was killed by signal ")
                      << (WIFEXITED(status) ? code : WTERMSIG(status)) << "; stopping the other ranks\n";
          }
          stop_all(SIGTERM);
        }
      }
      any_running |= ranks[r].running;
    }
    if (!any_running) break;
    if (first_exit && !kill_at && Clock::now() - first_exit->second > grace) {
      std::string left;
      int count = 0;
      for (int r = 0; r < ranks.size(); ++r) {
        if (ranks[r].running) left += (count++ ? ", " : "") + std::to_string(first + r);
      }
      std::cerr << "push launch: rank" << (count > 1 ? "s " : " ") << left << " still ran " << grace.count()
                << " s after rank " << first_exit->first << " exited (stopped or hung?); stopping "
                << (count > 1 ? "them" : "it") << " (--grace S gives the ranks longer)\n";
      outlived = true;
      stop_all(SIGTERM);
    }
    if (kill_at && Clock::now() > *kill_at) stop_all(SIGKILL);
  }
  drain_output(ranks, first);
  if (forwarded) return 128 + forwarded;
  if (first_failure != 0) return first_failure;
  return outlived ? 1 : 0;
}

int launch_main(int argc, char** argv) {
  LaunchArgs a;
  if (const auto exit_status = parse_launch_args(argc, argv, a)) return *exit_status;
  // A port free on every address (rank 0's store binds it on MASTER_ADDR only, and the
  // address each host's ranks use for it may differ from the one this host sees).
  if (a.port == 0) a.port = push::dist::free_port("0.0.0.0");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // One job id for every host of the job (their launchers share only the command line).
  a.job = {{"PUSH_JOB_ID", a.nnodes > 1 ? "push-launch:" + a.addr + ":" + std::to_string(a.port)
                                        : std::string("push-launch:") + host + ":" + std::to_string(getpid())},
           {"PUSH_JOB_SECRET", push::dist::new_job_secret()}};

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Ranks ranks(a.nproc);
  for (int r = 0; r < a.nproc; ++r) {
    std::vector<std::string> env = rank_environment(r, a);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    ranks.start(r, a.program.data(), envp.data());
  }
  return supervise(ranks, a.node_rank * a.nproc, std::chrono::seconds(a.grace));
}

}  // namespace

PUSH_CLI_COMMAND(launch, "start N local ranks of a program for push::dist (like torchrun --no-python)", launch_main);

}  // namespace push::cli
