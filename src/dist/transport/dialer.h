#pragma once
// Dialing a member: a socket connected to its address and the handshake that proves this
// member to it (handshake.h), giving the connection this member's requests go out on.
#include <string>

#include "core/clock.h"
#include "dist/transport/connection.h"

namespace push::dist::detail {

struct TransportOptions;
class ReceivePool;

/// Dials group rank `peer` at "host:port" and proves this member. A refused connection is
/// tried again every 20 ms until `deadline` when `retry` (the peer may not listen yet).
/// The caller watches the connection it returns. Throws push::Error naming the peer.
ConnectionPtr dial_member(const TransportOptions& options, ReceivePool& pool, int peer, const std::string& address,
                          push::detail::Clock::time_point deadline, bool retry);

}  // namespace push::dist::detail
