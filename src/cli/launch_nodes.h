#pragma once
// What a job over several hosts needs before its launchers start anything: push launch
// and push train (--nnodes) refuse the same missing pieces, in the same words.
#include <string>

namespace push::cli {

/// Why `nnodes` hosts, this one `node_rank`, cannot form one job with node 0 at
/// `master_addr` (empty: not given) : `master_port` (0: not given), or "" when they can.
/// Needs, for nnodes > 1: an address other hosts reach (not a loopback one), a port, and
/// PUSH_JOB_SECRET in the environment (the same on every host).
std::string nodes_refusal(int nnodes, int node_rank, const std::string& master_addr, int master_port);

/// Why PUSH_JOB_SECRET, when the environment sets it, cannot be the job's secret (it is
/// not 64 hexadecimal digits), or "": said by the launcher before any rank starts.
std::string secret_refusal();

}  // namespace push::cli
