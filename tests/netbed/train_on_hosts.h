#pragma once
// The fixture of push train on the test bed's hosts (netbed.h): ranks started by hand as a
// batch script would (RANK, WORLD_SIZE, MASTER_ADDR = host 0's address), or whole nodes by
// `push train --nnodes N --node-rank K`; one PUSH_JOB_SECRET for the job. Skips, saying
// why, where no bed can be made.
#include <push/dist/world.h>

#include <arpa/inet.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "netbed/netbed.h"

namespace push::testing {

class TrainOnHosts : public Cli {
 protected:
  void SetUp() override {
    if (const auto why = NetBed::unavailable(); !why.empty()) GTEST_SKIP() << "no test bed here: " << why;
    Cli::SetUp();
  }
  /// Starts rank `rank` of `world` on host `host` of `bed`: `push train ARGS`, its output to
  /// rank<R>.log in the test's folder.
  pid_t start_rank(const NetBed& bed, int host, int rank, int world, const std::string& args,
                   const std::vector<std::string>& env = {}) {
    launcher_ = bed.exec_prefix(host);
    std::vector<std::string> vars = {
        "RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=0",
        "LOCAL_WORLD_SIZE=1",           "MASTER_ADDR=" + bed.address(0),       "MASTER_PORT=29500",
        "PUSH_JOB_ID=netbed",           "PUSH_JOB_SECRET=" + secret_};
    vars.insert(vars.end(), env.begin(), env.end());
    const pid_t pid = start(args, dir_ / ("rank" + std::to_string(rank) + ".log"), vars);
    launcher_.clear();
    return pid;
  }
  std::string log(int rank) { return slurp(dir_ / ("rank" + std::to_string(rank) + ".log")); }
  /// Runs `push train ARGS --nnodes N --node-rank K ...` on each host of `bed` (node K on host
  /// K), as a user would on a cluster, and expects each to succeed; node K's output is in
  /// node<K>.log. Returns whether every node succeeded.
  bool run_nodes(const NetBed& bed, const std::string& args) {
    std::vector<pid_t> nodes;
    for (int k = 0; k < bed.hosts(); ++k) {
      launcher_ = bed.exec_prefix(k);
      nodes.push_back(start(args + " --nnodes " + std::to_string(bed.hosts()) + " --node-rank " + std::to_string(k) +
                                " --master-addr " + bed.address(0) + " --master-port 29500",
                            dir_ / ("node" + std::to_string(k) + ".log"), {"PUSH_JOB_SECRET=" + secret_}));
      launcher_.clear();
    }
    bool ok = true;
    for (int k = 0; k < bed.hosts(); ++k) {
      int status = 0;
      const bool exited = ::waitpid(nodes[static_cast<size_t>(k)], &status, 0) == nodes[static_cast<size_t>(k)];
      ok = ok && exited && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      EXPECT_TRUE(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "node " << k << ":\n"
          << slurp(dir_ / ("node" + std::to_string(k) + ".log"));
    }
    return ok;
  }
  std::string secret_ = push::dist::new_job_secret();
};

/// Whether process `pid` has an established TCP connection to `peer` (an IPv4 address), in
/// its own network namespace (/proc/PID/net/tcp).
inline bool connected_to(pid_t pid, const std::string& peer) {
  in_addr a{};
  if (::inet_pton(AF_INET, peer.c_str(), &a) != 1) return false;
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08X", a.s_addr);  // as the kernel prints it: host byte order
  std::ifstream in("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream row(line);
    std::string slot, local, remote, state;
    row >> slot >> local >> remote >> state;
    if (state == "01" && remote.rfind(hex, 0) == 0) return true;  // 01: ESTABLISHED
  }
  return false;
}

}  // namespace push::testing
