#pragma once
// Joining the job on its store, once the store is up (World's constructor): each rank claims
// its rank number, publishes who it is (job id, world size, host and process, a fingerprint
// of the job secret, its name), and checks every other rank's record against its own, so
// that two jobs on one MASTER_PORT, a rank started twice or a mismatched WORLD_SIZE fail at
// once with both sides named. Gives the World its names and the job secret.
#include "core/clock.h"
#include "dist/c10d.h"

namespace push::dist::detail {

/// s.secret from PUSH_JOB_SECRET, or drawn by rank 0 (and written to a private file for the
/// others, secret_file.h) when none is given; other ranks given none learn it in open_own_store.
void take_secret(WorldState& s);

/// The job's store when push hosts it (not a launcher): rank 0 starts s.server on
/// MASTER_ADDR:MASTER_PORT; every rank connects a client that proves the job's secret
/// (reading rank 0's secret file first when it was given none). By `deadline`.
c10::intrusive_ptr<c10d::Store> open_own_store(WorldState& s, std::chrono::steady_clock::time_point deadline);

/// A socket listening on `host`:`port` only (not every interface), for the store server.
/// Throws push::Error naming the address.
int store_listen_fd(const std::string& host, int port);

/// Fills s.names (and s.secret from rank 0's file under a launcher's store). Throws push::Error naming what is wrong; a
/// rank missing at `deadline` is named with the ranks that did come.
void join_job(WorldState& s, push::detail::Clock::time_point deadline);

/// "host:pid" of this process.
std::string this_process();

}  // namespace push::dist::detail
