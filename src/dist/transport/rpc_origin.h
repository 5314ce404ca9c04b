#pragma once
// The name RpcGroup's errors carry, whichever of its parts (calls, serving, transport,
// wire format, shared-memory rings) raises them.

namespace push::dist::detail {

inline constexpr const char* kRpcOrigin = "push::dist::RpcGroup";

}  // namespace push::dist::detail
