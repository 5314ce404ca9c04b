// Helpers of transport_bench.cpp that are not about any one transport: starting the second
// rank, the raw TCP echo that every row is compared with, a command channel from rank 0 to
// rank 1 through the job's store, and the CPU time and thread count of both processes.
#pragma once

#include <benchmark/benchmark.h>
#include <push/dist/store.h>
#include <torch/torch.h>

#include "bench_ranks.h"
#include "tcp_echo.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace transport_bench {

[[noreturn]] inline void fail(const std::string& what) {
  std::cerr << "push_bench_transport: " << what << std::endl;
  std::exit(1);
}

// ---- two ranks from one binary ---------------------------------------------------------

/// Rank 0 (no PUSH_DIST_BENCH_CHILD in the environment) picks a free port, sets torchrun's
/// variables and forks + execs itself as rank 1, which dies with it. Returns rank 1's pid
/// on rank 0, 0 on rank 1.
inline pid_t start_second_rank(char* argv0) {
  const auto peers = push_bench::start_ranks(argv0, 2);
  return peers.empty() ? 0 : peers.front();
}

// ---- rank 0 -> rank 1 commands through the store ----------------------------------------

/// Numbered keys: rank 0 sets bench/cmd/<n> and waits for bench/ack/<n>, which rank 1 sets
/// when it has carried the command out (its answer is the key's value).
class Control {
 public:
  explicit Control(push::dist::Store store) : store_(std::move(store)) {}

  void post(const std::string& command) { set("bench/cmd/" + std::to_string(next_), command); }
  std::string answer() { return take("bench/ack/" + std::to_string(next_++), std::nullopt); }
  std::string call(const std::string& command) {
    post(command);
    return answer();
  }

  /// Rank 1: the next command (rank 0 may take minutes between two).
  std::string next() { return take("bench/cmd/" + std::to_string(next_), std::chrono::hours(1)); }
  void reply(const std::string& answer) { set("bench/ack/" + std::to_string(next_++), answer); }

 private:
  void set(const std::string& key, const std::string& value) {
    store_.set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  /// Waits for `key` at most `timeout`; without one, as long as the store waits (init_timeout).
  std::string take(const std::string& key, std::optional<std::chrono::milliseconds> timeout) {
    if (timeout)
      store_.wait({key}, *timeout);
    else
      store_.wait({key});
    const auto bytes = store_.get(key);
    return {bytes.begin(), bytes.end()};
  }

  push::dist::Store store_;
  int64_t next_ = 0;
};

// ---- the raw TCP baseline (tcp_echo.h) -------------------------------------------------

using push_bench::check_io;
using push_bench::read_all;
using push_bench::serve_tcp_echo;
using push_bench::write_all;

/// Rank 0: one connection to rank 1's echo; round_trip sends a tensor's bytes and returns
/// where the echo landed (valid until the next call).
class TcpEcho {
 public:
  explicit TcpEcho(const push::dist::Store& store) : fd_(push_bench::connect_tcp_echo(store)) {}
  TcpEcho(const TcpEcho&) = delete;
  TcpEcho& operator=(const TcpEcho&) = delete;
  ~TcpEcho() { close(fd_); }

  const void* round_trip(const at::Tensor& arg) {
    const uint64_t n = arg.nbytes();
    back_.resize(n);
    write_all(fd_, &n, sizeof(n));
    write_all(fd_, arg.data_ptr(), n);
    read_all(fd_, back_.data(), n);
    return back_.data();
  }

 private:
  int fd_ = -1;
  std::vector<char> back_;
};

// ---- what a row costs beside its time ---------------------------------------------------

/// CPU seconds used so far by this process and by `peer`, together (every thread).
inline double cpu_seconds(pid_t peer) {
  double total = 0;
  for (const pid_t pid : {getpid(), peer}) {
    clockid_t clock;
    timespec t{};
    if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &t) != 0) {
      fail("cannot read the CPU clock of process " + std::to_string(pid));
    }
    total += static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  return total;
}

/// Threads of this process and of `peer`, together.
inline int thread_count(pid_t peer) {
  int total = 0;
  for (const pid_t pid : {getpid(), peer}) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Threads:", 0) == 0) total += std::stoi(line.substr(8));
    }
  }
  return total;
}

}  // namespace transport_bench
