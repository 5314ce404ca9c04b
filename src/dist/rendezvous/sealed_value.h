#pragma once
// Values one member of an RPC group publishes in the job's store for the others (its
// address), sealed under the group's key: the store has no authentication, so any local
// user can rewrite a key, and a member takes nothing from it that does not carry the seal
// (docs/distributed.md, "Who gets in").
//   store->set(k, string_to_bytes(seal(key, k, address)));
//   const std::string address = unseal(key, k, bytes_to_string(store->get(k)), "the address of worker1");
#include <string>

#include "dist/transport/handshake.h"

namespace push::dist::detail {

/// `value` followed by a line with HMAC-SHA256(group key, store key | value) in hex.
std::string seal(const handshake::Bytes& key, const std::string& store_key, const std::string& value);

/// The value `sealed` carries when its seal is right for `store_key` under `key`; else
/// throws push::Error saying that `what` in the store was not written by a member of the job.
std::string unseal(const handshake::Bytes& key, const std::string& store_key, const std::string& sealed,
                   const std::string& what);

}  // namespace push::dist::detail
