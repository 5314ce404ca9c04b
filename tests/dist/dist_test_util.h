#pragma once
// Multi-process tests. A test in the parent process calls run_workers(n, "name"), which
// starts this same binary n times (fork + execve of /proc/self/exe) on 127.0.0.1 with a
// free port and torchrun's variables, filtered to DistWorker.DISABLED_Run, which runs the
// body registered under "name" with PUSH_DIST_WORKER(name). Children die with the parent
// (PR_SET_PDEATHSIG) and are killed when the deadline passes, so no test hangs.
#include <push/dist.h>

#include <gtest/gtest.h>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace push::testing {

using WorkerBody = std::function<void()>;
std::map<std::string, WorkerBody>& worker_registry();
struct WorkerRegistrar {
  WorkerRegistrar(const std::string& name, WorkerBody body) { worker_registry()[name] = std::move(body); }
};

/// push::dist::free_port(), under the name tests outside tests/dist still call it by.
int free_port();

/// Where run_workers starts the ranks: by default all on 127.0.0.1, from this binary. The
/// test bed (tests/netbed) puts rank r on host `host_of[r]`: `prefix[host]` goes in front
/// of its command line (`ip netns exec HOST`), MASTER_ADDR is host 0's address, LOCAL_RANK
/// and LOCAL_WORLD_SIZE count the ranks of each host, and `binary` may name another test
/// binary whose PUSH_DIST_WORKER bodies run.
struct Placement {
  std::string master_addr = "127.0.0.1";
  std::vector<int> host_of;                      // empty: every rank on one host
  std::vector<std::vector<std::string>> prefix;  // by host; none when empty
  std::string binary;                            // this test binary when empty
};

/// Memory rings (rpc shared memory) this process has made: each is a memfd it keeps open.
int rings_here();

/// Exit status of each rank: the exit code, or 128 + signal; -1 when killed at the deadline.
std::vector<int> run_workers(int n, const std::string& worker, std::chrono::seconds deadline = std::chrono::seconds(90),
                             const std::vector<std::string>& extra_env = {}, const Placement& placement = {});

/// Expects every rank to have exited with 0 (a failure names the rank).
void expect_all_ok(const std::vector<int>& codes);

/// Runs `argv` (absolute program path first) with extra environment; returns the exit
/// status (as above) and everything it printed (stdout and stderr).
std::pair<int, std::string> run_program(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                                        std::chrono::seconds deadline);

/// The World of a worker, with test-sized timeouts.
push::dist::World test_world(std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// The fields of /proc/PID/stat from its state on, split at spaces (the name, which may hold
/// both, is skipped): [0] the state letter, [11] utime, [12] stime. Empty when it is gone.
std::vector<std::string> proc_stat(pid_t pid);

/// Whether process `pid` is stopped (SIGSTOP: state T in /proc/PID/stat).
bool is_stopped(pid_t pid);

/// The CPU time process `pid` has used, user and system, in seconds; 0 when it is gone.
double cpu_seconds(pid_t pid);

/// The CPU time this process has used (every thread, user and system), in seconds, to the
/// microsecond.
double process_cpu_seconds();

/// Waits at most `limit` until this process is quiet: under 30% of a core used over 100 ms.
/// What a test set going (a flood of connections to accept) has been served then, and a
/// measurement of idle CPU can begin; a process that never quiets fails that measurement.
void wait_until_quiet(std::chrono::seconds limit = std::chrono::seconds(10));

/// Waits until this process is quiet (wait_until_quiet), then returns the CPU seconds it uses
/// over the next second of real time: what a server left idle (a flood of connections it
/// cannot accept, say) burns.
double cpu_seconds_over_an_idle_second();

/// Shuts `rpc` down, ignoring the failure of its barrier (it waits for a member a test killed).
void shutdown_quietly(push::dist::RpcGroup& rpc);

/// The path of this test binary.
std::string self_path();

}  // namespace push::testing

#define PUSH_DIST_WORKER(name)                                                                               \
  static void push_dist_worker_##name();                                                                     \
  static ::push::testing::WorkerRegistrar push_dist_worker_registrar_##name(#name, push_dist_worker_##name); \
  static void push_dist_worker_##name()
