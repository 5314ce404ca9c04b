#pragma once
// OrderedServer: a versioned key-value store that one member of an RpcGroup hosts and every
// member reads and writes (machin's OrderedServerSimple / OrderedServerSimpleImpl).
//
//   // On the member that hosts it (lives as long as the host object):
//   push::server::OrderedServerHost host(rpc, "params", OrderedServerOptions().version_depth(4));
//   rpc.barrier();
//   // On any member:
//   push::server::OrderedServer server(rpc, "params");
//   server.push("w", w, /*version=*/1, /*prev_version=*/std::nullopt);  // creates "w"
//   server.push("w", w2, 2, 1);            // true: 1 was the newest version
//   server.push("w", w3, 2, 1);            // false: 2 is the newest now
//   auto newest = server.pull("w");        // {w2, 2}; pull("w", 1) -> {w, 1}
//
// push is a compare-and-set: it stores `version` only when `prev_version` is the key's
// newest version at the moment the host applies it, so of pushers who read the same
// version exactly one wins and the versions of a key form one chain. Unlike machin:
// creating a key is a compare-and-set too (prev_version nullopt: only while the key has no
// version; machin lets every pusher of a new key win, the last one silently), a version
// equal to prev_version or to one still kept is an error (machin allows it and gives up
// the order), and `version_depth` versions are kept (machin keeps version_depth + 1).
// Values are c10::IValues (tensors, lists, dicts, tuples of them) and are copies: a pushed
// tensor changed afterwards does not change the stored value.
#include <push/dist/rpc.h>
#include <push/server/ordered_server_base.h>

#include <torch/arg.h>

#include <memory>
#include <optional>
#include <string>

namespace push::server {

struct OrderedServerOptions {
  /// Versions kept per key, the newest included (>= 1); older ones are dropped.
  TORCH_ARG(int64_t, version_depth) = 1;
};

/// Hosts the ordered server `name` on this member of `group` from construction until
/// destruction (its services are "<name>/push" and "<name>/pull"; a second host of one
/// name in a group is a push::Error). Thread-safe. As an OrderedServerBase it is the
/// host's own handle, without a round trip.
class OrderedServerHost : public OrderedServerBase {
 public:
  OrderedServerHost(dist::RpcGroup group, std::string name, OrderedServerOptions options = {});
  OrderedServerHost(const OrderedServerHost&) = delete;
  OrderedServerHost& operator=(const OrderedServerHost&) = delete;

  const std::string& name() const override { return name_; }
  /// Keys stored so far.
  size_t size() const;
  /// OrderedServer's push and pull for the host itself, without a round trip. The value is
  /// stored as given: do not change its tensors afterwards.
  bool push(const std::string& key, c10::IValue value, int64_t version,
            std::optional<int64_t> prev_version) const override;
  std::optional<Versioned> pull(const std::string& key, std::optional<int64_t> version) const override;
  using OrderedServerBase::pull;

  struct Store;

 private:
  std::string name_;
  std::shared_ptr<Store> store_;
  dist::ServiceSet services_;
};

/// Any member's handle on the ordered server `name` of `group` (cheap to copy). Each call
/// is one round trip to the host; a host that is gone or never was is a push::Error naming
/// the server, after the group's timeout at most. push's OrderedServerBase.
class OrderedServer : public OrderedServerBase {
 public:
  OrderedServer(dist::RpcGroup group, std::string name, std::optional<dist::Milliseconds> timeout = std::nullopt);

  const std::string& name() const override { return name_; }
  /// Stores `value` as `version` of `key` if `prev_version` is the key's newest version
  /// (nullopt: if the key has none yet). Returns whether it did.
  bool push(const std::string& key, c10::IValue value, int64_t version,
            std::optional<int64_t> prev_version) const override;
  /// The newest version of `key`, or the given one; nothing when the key has no version or
  /// that version was never pushed or has been dropped.
  std::optional<Versioned> pull(const std::string& key, std::optional<int64_t> version) const override;
  using OrderedServerBase::pull;

 private:
  c10::IValue call(const std::string& service, const char* what, dist::RpcArgs args) const;
  dist::RpcGroup group_;
  std::string name_;
  std::optional<dist::Milliseconds> timeout_;
};

}  // namespace push::server
