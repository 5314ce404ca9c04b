#pragma once
// Joining the job on its store, once the store is up (World's constructor): each rank claims
// its rank number, publishes who it is (job id, world size, host and process, a fingerprint
// of the job secret, its name), and checks every other rank's record against its own, so
// that two jobs on one MASTER_PORT, a rank started twice or a mismatched WORLD_SIZE fail at
// once with both sides named. Gives the World its names and the job secret.
#include "c10d.h"
#include "core/clock.h"

namespace push::dist::detail {

/// Fills s.names and s.secret. Throws push::Error naming what is wrong; a rank missing at
/// `deadline` is named with the ranks that did come.
void join_job(WorldState& s, push::detail::Clock::time_point deadline);

/// "host:pid" of this process.
std::string this_process();

}  // namespace push::dist::detail
