#pragma once
// The ranks of a `push launch` job as processes. Each rank leads its own process group,
// so that a signal reaches its whole process tree; its stdout and stderr come back on two
// pipes. No process outlives the job: when a rank exits, whatever is left of its group
// (background children) is killed; when the launcher is killed (even by SIGKILL), its
// ranks die with it (PR_SET_PDEATHSIG) and a watchdog process kills what is left of their
// groups; a rank that cannot be started (no file descriptors, no processes left) throws,
// and the ranks already running are stopped and reaped.
//   Ranks ranks(nproc);
//   for (int r = 0; r < nproc; ++r) ranks.start(r, program, environment_of(r));
//   ... poll ranks[r].streams, ranks.reap(r, status) ...
#include <sys/types.h>

#include <array>
#include <string>
#include <vector>

namespace push::cli {

/// One of a rank's output streams: the read end of its pipe (non-blocking; -1 once
/// closed), and what came after the last newline.
struct Stream {
  int fd = -1;
  std::string partial;
  std::string said;  // the last error line of a push program forwarded from it ("push train: ...")
};

struct Rank {
  pid_t pid = -1;  // also its process group id
  // Its stdout and stderr, each forwarded to the launcher's own.
  std::array<Stream, 2> streams;
  bool running = false;
};

/// A forked process that kills what is left of the ranks' process groups when the
/// launcher dies without doing it (SIGKILL). It learns the groups over a pipe; the pipe's
/// end of file, however the launcher went, is its signal. The launcher has other threads
/// (LibTorch's), so after fork the watchdog only makes system calls: no allocation.
class Watchdog {
 public:
  explicit Watchdog(int max_groups);
  /// The launcher cleaned up itself: the watchdog stands down and is reaped.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(pid_t group) { send(group); }
  void forget(pid_t group) { send(-group); }

 private:
  void send(int32_t message);
  [[noreturn]] void run(int from_launcher);

  std::vector<pid_t> groups_;  // sized before the fork
  pid_t pid_ = -1;
  int to_watchdog_ = -1;
};

/// The ranks of the job. Whatever way the launcher leaves (an exception while starting
/// them included), no rank and no process of a rank's group is left running.
class Ranks {
 public:
  /// Starts the watchdog (std::runtime_error "cannot start: ..." when it cannot be).
  explicit Ranks(int n);
  ~Ranks();
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  Rank& operator[](int r) { return ranks_[r]; }
  int size() const { return static_cast<int>(ranks_.size()); }

  /// Forks rank r running `program` (argv, null-terminated) with the environment `envp`,
  /// its stdout and stderr on the pipes of its streams. std::runtime_error "cannot start
  /// rank r of n: ..." when it cannot be.
  void start(int r, char* const* program, char* const* envp);
  /// Whether rank r has exited; then it is reaped, its status in `status`. Before reaping,
  /// the rest of its process group is killed: the rank's zombie still holds the group id,
  /// so the id cannot have been reused by an unrelated group.
  bool reap(int r, int& status);

 private:
  Watchdog watchdog_;  // first: it outlives every rank
  std::vector<Rank> ranks_;
};

}  // namespace push::cli
