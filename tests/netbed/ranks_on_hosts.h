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

/// Ranks on hosts: rank r runs in host `host_of[r]` of `bed`, LOCAL_RANK counting the ranks
/// before it on the same host; `binary` is the test binary whose worker runs (empty: this).
inline Placement on_hosts(const NetBed& bed, const std::vector<int>& host_of, const std::string& binary = {}) {
  Placement p;
  p.master_addr = bed.address(host_of.at(0));
  p.binary = binary;
  std::vector<std::string> names;
  for (int h = 0; h < bed.hosts(); ++h) names.push_back(bed.name(h));
  p.prefix = [names, host_of](int rank) {
    return std::vector<std::string>{"/usr/bin/env", "ip", "netns", "exec",
                                    names.at(static_cast<size_t>(host_of.at(static_cast<size_t>(rank))))};
  };
  p.local_rank = [host_of](int rank) {
    int local = 0;
    for (int r = 0; r < rank; ++r) local += host_of.at(static_cast<size_t>(r)) == host_of.at(static_cast<size_t>(rank));
    return local;
  };
  return p;
}

}  // namespace push::testing
