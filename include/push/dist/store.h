#pragma once
// Store: the job's key-value store (rank 0 hosts it), for the small values ranks must agree
// on outside collectives and RPC: who has what, who arrived, a flag that says "go on".
//
//   push::dist::Store store = world.store();
//   store.set("myjob/ready", {1});
//   store.wait({"myjob/ready"}, std::chrono::seconds(30));   // push::Error after 30 s
//   std::vector<uint8_t> v = store.get("myjob/ready");
//   int64_t arrived = store.add("myjob/arrived", 1);          // a counter, atomically
//
// A cheap, copyable handle; every copy reaches the same store, through the World's one
// connection (a wait holds up the other users of that World's store until it returns).
// Thread-safe. Keys are shared by every rank of the job: prefix your own; push's are under
// "push/". Failures (a store that is gone, a wait that runs out) are push::Errors.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace push::dist {

namespace detail {
struct StoreState;
class WorldAccess;
}  // namespace detail

class Store {
 public:
  /// An empty handle: every member throws push::Error. World::store() gives real ones.
  Store() = default;

  void set(const std::string& key, const std::vector<uint8_t>& value) const;
  /// The value of `key`; waits for the key as long as the World's init_timeout.
  std::vector<uint8_t> get(const std::string& key) const;
  /// Whether every one of `keys` is set, without waiting.
  bool check(const std::vector<std::string>& keys) const;
  /// Waits until every one of `keys` is set, as long as the World's init_timeout.
  void wait(const std::vector<std::string>& keys) const;
  /// Waits until every one of `keys` is set, at most `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) const;
  /// Adds `delta` to the counter under `key` (0 when absent) and returns its new value.
  int64_t add(const std::string& key, int64_t delta) const;

 private:
  friend class detail::WorldAccess;
  explicit Store(std::shared_ptr<detail::StoreState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::StoreState> state_;
};

}  // namespace push::dist
