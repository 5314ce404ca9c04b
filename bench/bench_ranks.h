// Starting the other ranks of a distributed benchmark: rank 0 (no PUSH_DIST_BENCH_CHILD in
// its environment) picks a free loopback port, sets torchrun's variables and forks + execs
// itself once per other rank; each child dies with rank 0 (PR_SET_PDEATHSIG).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace push_bench {

/// A loopback port nobody listens on right now (the kernel's pick for port 0).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("push bench: cannot find a free port");
    std::exit(1);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

/// On rank 0: starts ranks 1 .. world_size-1 and returns their pids. In a child: returns
/// nothing (RANK and the rest are already set).
inline std::vector<pid_t> start_ranks(char* argv0, int world_size) {
  if (std::getenv("PUSH_DIST_BENCH_CHILD") != nullptr) return {};
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(free_port()).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
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

}  // namespace push_bench
