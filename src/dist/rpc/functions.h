#pragma once
// The functions registered in this process by name (register_function, PUSH_RPC_FUNCTION),
// for the RPC server and for push's own services that call one locally.
#include <push/dist/rpc.h>

#include <string>

namespace push::dist::detail {

/// The function registered under `name`, or an empty one.
RpcFunction find_function(const std::string& name);
/// Registers `fn` under `name`; push::Error on a duplicate.
void add_function(const std::string& name, RpcFunction fn);

}  // namespace push::dist::detail
