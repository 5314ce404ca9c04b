#pragma once
// OrderedServerBase: what the model and gradient servers need of an ordered server, a
// versioned compare-and-set store (machin's OrderedServerBase, their `o_server` argument).
// push's OrderedServer (ordered_server.h: one member of an RPC group hosts the store) is
// one implementation; a backend of your own (a database, a store another service keeps)
// implements these calls with the same contract and is handed to ModelServer, or to a
// gradient server's GradServerOptions::model_store:
//
//   class MyStore : public push::server::OrderedServerBase { ... };
//   push::server::ModelServer models(std::make_shared<MyStore>(...), "actor");
//
// The contract, which ModelServer and GradServer rely on:
// - push(key, value, version, prev) stores `value` as `version` of `key` and returns true
//   only when `prev` is the key's newest version at that moment (nullopt: only while the
//   key has none), atomically with respect to every other push of the key: of pushers
//   who read the same version exactly one wins. It returns false otherwise; bad input
//   (a version equal to `prev` or to one still kept) throws.
// - pull(key) gives the newest version, pull(key, v) version v; nothing when there is
//   none. A store may keep a pushed value as given and hand the same tensors out: callers
//   change neither (ModelServer pushes fresh copies and copies out of what it pulls).
// - Calls may come from any thread at once.
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>

namespace push::server {

/// A value and the version it was pushed as.
struct Versioned {
  c10::IValue value;
  int64_t version = 0;
};

class OrderedServerBase {
 public:
  virtual ~OrderedServerBase() = default;
  /// The server's name, for messages.
  virtual const std::string& name() const = 0;
  /// Stores `value` as `version` of `key` if `prev_version` is the key's newest version
  /// (nullopt: if the key has none yet). Returns whether it did.
  virtual bool push(const std::string& key, c10::IValue value, int64_t version,
                    std::optional<int64_t> prev_version) const = 0;
  /// The newest version of `key`, or version `version`; nothing when the key has no such
  /// version.
  virtual std::optional<Versioned> pull(const std::string& key, std::optional<int64_t> version) const = 0;
  std::optional<Versioned> pull(const std::string& key) const { return pull(key, std::nullopt); }
};

}  // namespace push::server
