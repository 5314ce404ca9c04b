#pragma once
// Which member of an RPC group holds each of its services and paired values: one key per
// (kind, key) in the job's store, claimed with compareSet, so two members can never both
// hold one, and released with compareSet back to empty. A member remembers the holders it
// has looked up, so calls by key make no store round trip; a holder that no longer holds
// the key says so, and the caller asks afresh (rpc_calls.cpp).
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <mutex>
#include <string>

namespace push::dist::detail {

/// Thread-safe.
class KeyHolders {
 public:
  /// `prefix` is the group's in the store; `rank` this process's global rank.
  KeyHolders(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank);

  /// Claims `key` of `kind` ("service" or "paired") for this rank: -1 when it holds it now,
  /// else the global rank that held it already.
  int claim(const char* kind, const std::string& key);
  /// Gives up this rank's claim (nothing happens when it holds none).
  void release(const char* kind, const std::string& key);
  /// The global rank that holds `key`, -1 when none does. `fresh` asks the store; otherwise
  /// the holder remembered from an earlier lookup is trusted.
  int lookup(const char* kind, const std::string& key, bool fresh);

 private:
  std::string store_key(const char* kind, const std::string& key) const;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::string mine_;  // this rank, as the store holds it
  std::mutex mutex_;
  std::map<std::string, int> holders_;  // store key -> global rank, as last seen in the store
};

}  // namespace push::dist::detail
