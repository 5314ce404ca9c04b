#pragma once
// What the wire protocol's tests (tests/dist/rpc_wire_test.cpp) reach inside a group: where
// a member listens, and the token its connections must introduce themselves with (wire.h
// has the frame format). Defined in rpc.cpp.
#include <push/dist/rpc.h>

#include <string>

namespace push::dist::detail {

class RpcTestAccess {
 public:
  static int port(const RpcGroup& group);
  static std::string token(const RpcGroup& group);
};

}  // namespace push::dist::detail
