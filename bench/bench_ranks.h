// Starting the other ranks of a distributed benchmark: rank 0 (no PUSH_DIST_BENCH_CHILD in
// its environment) picks a free loopback port, sets torchrun's variables and forks + execs
// itself once per other rank; each child dies with rank 0 (PR_SET_PDEATHSIG). And a c10d
// TCPStore for the baselines that call c10d directly.
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <push/dist/free_port.h>
#include <push/dist/world.h>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace push_bench {

/// A c10d TCPStore for the job of `world` (rank 0 hosts it, on the port start_ranks drew
/// into PUSH_BENCH_C10D_PORT): what the raw Gloo group and LibTorch's TensorPipeAgent meet
/// through in the baselines, as they would in a program on c10d alone. (push's own store
/// speaks only to clients that prove the job's secret.)
inline c10::intrusive_ptr<c10d::Store> c10d_store(const push::dist::World& world) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(std::atoi(std::getenv("PUSH_BENCH_C10D_PORT")));
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = world.options().init_timeout();
  if (world.rank() == 0) {
    // The server, started once and kept for the life of the process (never destroyed: the
    // baselines' groups may outlive any owner here). Each call gets a client of its own.
    static const auto* server = [&] {
      c10d::TCPStoreOptions s = o;
      s.isServer = true;
      s.numWorkers = static_cast<std::size_t>(world.size());
      return new c10::intrusive_ptr<c10d::TCPStore>(
          c10::make_intrusive<c10d::TCPStore>(world.options().master_addr(), s));
    }();
    (void)server;
  }
  return c10::make_intrusive<c10d::TCPStore>(world.options().master_addr(), o);
}

/// On rank 0: starts ranks 1 .. world_size-1 and returns their pids. In a child: returns
/// nothing (RANK and the rest are already set).
inline std::vector<pid_t> start_ranks(char* argv0, int world_size) {
  if (std::getenv("PUSH_DIST_BENCH_CHILD") != nullptr) return {};
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(push::dist::free_port()).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  setenv("PUSH_BENCH_C10D_PORT", std::to_string(push::dist::free_port()).c_str(), 1);
  std::vector<pid_t> peers;
  for (int rank = 1; rank < world_size; ++rank) {
    const pid_t peer = fork();
    if (peer == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("PUSH_DIST_BENCH_CHILD", "1", 1);
      execl("/proc/self/exe", argv0, static_cast<char*>(nullptr));
      _exit(127);
    }
    peers.push_back(peer);
  }
  setenv("RANK", "0", 1);
  return peers;
}

/// On rank 0: waits for the ranks start_ranks started. Returns rank 0's exit status: 0 when
/// every one exited with 0, else 1, each failure named on stderr (a rank that aborted, was
/// killed or exited with an error fails the run, not just its own process).
inline int wait_ranks(const std::vector<pid_t>& peers) {
  int failed = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    int status = 0;
    if (waitpid(peers[i], &status, 0) != peers[i]) {
      std::fprintf(stderr, "push bench: cannot wait for rank %zu\n", i + 1);
      failed = 1;
    } else if (WIFSIGNALED(status)) {
      std::fprintf(stderr, "push bench: rank %zu was killed by signal %d\n", i + 1, WTERMSIG(status));
      failed = 1;
    } else if (WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "push bench: rank %zu exited with status %d\n", i + 1, WEXITSTATUS(status));
      failed = 1;
    }
  }
  return failed;
}

}  // namespace push_bench
