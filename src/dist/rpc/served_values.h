#pragma once
// What one member of an RPC group serves to the others: the services it registered, the
// values it paired, and the results of remote() calls it keeps for the RRefs elsewhere
// (each under an id, until the last RRef is gone and its caller says so).
#include <push/dist/rpc.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace push::dist::detail {

/// Thread-safe: the public API registers and pairs, handler fibers look up and keep.
class ServedValues {
 public:
  /// false when `key` is registered here already.
  bool add_service(const std::string& key, RpcFunction handler);
  /// Removes the service and returns its handler (empty when there was none), for the
  /// caller to destroy outside the lock: what it captured may deregister services too.
  RpcFunction remove_service(const std::string& key);
  /// The handler of `key` (a copy, to call outside the lock); empty when not here.
  RpcFunction service(const std::string& key) const;

  /// false when `key` is paired here already.
  bool add_paired(const std::string& key, c10::IValue value);
  /// false when `key` was not paired here.
  bool remove_paired(const std::string& key);
  std::optional<c10::IValue> paired(const std::string& key) const;

  /// Keeps `value` for a remote() handle; returns the id its owner refers to it by.
  int64_t keep(c10::IValue value);
  /// The value kept under `id`; nullopt when released or never kept.
  std::optional<c10::IValue> kept(int64_t id) const;
  /// Drops the value kept under `id`; false when there was none.
  bool release(int64_t id);
  size_t kept_count() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, RpcFunction> services_;
  std::map<std::string, c10::IValue> paired_;
  std::map<int64_t, c10::IValue> kept_;
  int64_t next_id_ = 0;
};

}  // namespace push::dist::detail
