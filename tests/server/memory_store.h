#pragma once
// A second ordered-server backend, kept in this process's memory: what a user's own
// OrderedServerBase (a database, another service) looks like to the model and gradient
// servers. It keeps every version, checks nothing but the compare-and-set, and counts
// its calls so a test can see they came here.
#include <push/server/ordered_server_base.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

namespace push::testing {

class MemoryStore : public push::server::OrderedServerBase {
 public:
  explicit MemoryStore(std::string name = "memory") : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  bool push(const std::string& key, c10::IValue value, int64_t version,
            std::optional<int64_t> prev_version) const override {
    ++pushes;
    std::lock_guard lock(mutex_);
    auto& versions = keys_[key];
    const std::optional<int64_t> newest =
        versions.empty() ? std::nullopt : std::optional<int64_t>(versions.rbegin()->first);
    if (newest != prev_version) return false;
    versions.emplace(version, std::move(value));
    return true;
  }
  std::optional<push::server::Versioned> pull(const std::string& key, std::optional<int64_t> version) const override {
    ++pulls;
    std::lock_guard lock(mutex_);
    auto it = keys_.find(key);
    if (it == keys_.end() || it->second.empty()) return std::nullopt;
    auto found = version ? it->second.find(*version) : std::prev(it->second.end());
    if (found == it->second.end()) return std::nullopt;
    return push::server::Versioned{found->second, found->first};
  }
  mutable std::atomic<int> pushes{0}, pulls{0};

 private:
  std::string name_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::map<int64_t, c10::IValue>> keys_;
};

}  // namespace push::testing
