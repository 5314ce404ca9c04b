#pragma once
// The multi-rank tests of the other areas (their PUSH_DIST_WORKER bodies, dist_test_util.h)
// run with their ranks on the test bed's hosts: rank r in host `host_of[r]`, MASTER_ADDR
// host 0's address. The body is the one its own test runs on 127.0.0.1, with the same
// checks, so passing here means the same results across a network.
#include <string>
#include <vector>

#include "dist/dist_test_util.h"
#include "netbed/netbed.h"

namespace push::testing {

/// Ranks on hosts: rank r runs in host `host_of[r]` of `bed` (through `env`, which finds
/// `ip` on PATH: run_workers execs an absolute path); `binary` is the test binary whose
/// worker runs (empty: this one).
inline Placement on_hosts(const NetBed& bed, const std::vector<int>& host_of, const std::string& binary = {}) {
  Placement p;
  p.master_addr = bed.address(host_of.at(0));
  p.host_of = host_of;
  p.binary = binary;
  for (int h = 0; h < bed.hosts(); ++h) {
    p.prefix.push_back({"/usr/bin/env"});
    for (const auto& word : bed.exec_argv(h)) p.prefix.back().push_back(word);
  }
  return p;
}

}  // namespace push::testing
