#pragma once
// What the wire protocol's tests (tests/dist/rpc_wire_test.cpp) reach inside a group: where
// a member listens, and the key its connections prove they hold (handshake.h; wire.h has
// the frame format). Defined in rpc.cpp.
#include <push/dist/rpc.h>

#include <chrono>
#include <string>

#include "dist/transport/handshake.h"

namespace push::dist::detail {

class RpcTestAccess {
 public:
  static int port(const RpcGroup& group);
  static handshake::Bytes key(const RpcGroup& group);
  static int group_rank(const RpcGroup& group);
  /// How long a caller now looks for a reply from group rank `peer` (round_trips.h).
  static std::chrono::nanoseconds reply_window(const RpcGroup& group, int peer);
};

}  // namespace push::dist::detail
