#pragma once
// A one-member RPC group in the test's own process, for raw clients (raw_peer.h) to talk to
// by hand: the wire, trust and sealed-frame tests share it.
#include <push/dist.h>

#include "dist/transport/handshake.h"

namespace push::testing {

struct SoloMember {
  /// The group "solo" with `options` (its timeout set to 10 s).
  explicit SoloMember(dist::RpcGroupOptions options = dist::RpcGroupOptions());
  dist::World world;
  dist::RpcGroup rpc;
  int port() const;
  dist::detail::handshake::Bytes key() const;
  /// Whether a fresh, introduced connection gets the answer (42) to a well-formed call.
  bool answers() const;
};

}  // namespace push::testing
