// The ordered server: a map of version chains behind one mutex on the host, two services.
#include <push/server/ordered_server.h>

#include <push/core/errors.h>

#include <deque>
#include <map>
#include <mutex>

namespace push::server {
namespace {

constexpr const char* kOrderedHost = "push::server::OrderedServerHost";
constexpr const char* kOrderedClient = "push::server::OrderedServer";

std::string push_service(const std::string& name) { return name + "/push"; }
std::string pull_service(const std::string& name) { return name + "/pull"; }

void check_versions(const char* origin, const std::string& server, const std::string& key, int64_t version,
                    std::optional<int64_t> prev_version) {
  PUSH_CHECK(!prev_version || *prev_version != version, origin, "push of key '", key, "' on server '", server,
             "': version ", version, " equals prev_version (each push needs a new version)");
}

}  // namespace

struct OrderedServerHost::Store {
  std::string name;
  int64_t depth;
  mutable std::mutex mutex;
  std::map<std::string, std::deque<Versioned>> keys;  // oldest version first

  bool push(const std::string& key, c10::IValue value, int64_t version, std::optional<int64_t> prev) {
    std::lock_guard lock(mutex);
    auto it = keys.find(key);
    if (it == keys.end()) {
      if (prev) return false;
      keys[key].push_back({std::move(value), version});
      return true;
    }
    auto& chain = it->second;
    if (!prev || chain.back().version != *prev) return false;
    for (const auto& kept : chain) {
      PUSH_CHECK(kept.version != version, kOrderedHost, "server '", name, "': version ", version, " of key '", key,
                 "' exists (each push needs a new version)");
    }
    chain.push_back({std::move(value), version});
    while (static_cast<int64_t>(chain.size()) > depth) chain.pop_front();
    return true;
  }

  std::optional<Versioned> pull(const std::string& key, std::optional<int64_t> version) const {
    std::lock_guard lock(mutex);
    auto it = keys.find(key);
    if (it == keys.end()) return std::nullopt;
    if (!version) return it->second.back();
    for (const auto& kept : it->second) {
      if (kept.version == *version) return kept;
    }
    return std::nullopt;
  }
};

OrderedServerHost::OrderedServerHost(dist::RpcGroup group, std::string name, OrderedServerOptions options)
    : name_(std::move(name)), store_(std::make_shared<Store>()), services_(std::move(group)) {
  PUSH_CHECK(!name_.empty(), kOrderedHost, "the server needs a name");
  PUSH_CHECK(options.version_depth() >= 1, kOrderedHost, "version_depth must be >= 1, got ", options.version_depth());
  store_->name = name_;
  store_->depth = options.version_depth();
  // The handlers hold the store: a call already running when the host goes finishes on it.
  services_.add(push_service(name_), [store = store_](const dist::RpcArgs& a) {
    std::optional<int64_t> prev;
    if (!a.at(3).isNone()) prev = a.at(3).toInt();
    return c10::IValue(store->push(a.at(0).toStringRef(), a.at(1), a.at(2).toInt(), prev));
  });
  services_.add(pull_service(name_), [store = store_](const dist::RpcArgs& a) {
    std::optional<int64_t> version;
    if (!a.at(1).isNone()) version = a.at(1).toInt();
    auto found = store->pull(a.at(0).toStringRef(), version);
    if (!found) return c10::IValue();
    return c10::IValue(c10::ivalue::Tuple::create({found->value, found->version}));
  });
}

size_t OrderedServerHost::size() const {
  std::lock_guard lock(store_->mutex);
  return store_->keys.size();
}

bool OrderedServerHost::push(const std::string& key, c10::IValue value, int64_t version,
                             std::optional<int64_t> prev_version) const {
  check_versions(kOrderedHost, name_, key, version, prev_version);
  return store_->push(key, std::move(value), version, prev_version);
}

std::optional<Versioned> OrderedServerHost::pull(const std::string& key, std::optional<int64_t> version) const {
  return store_->pull(key, version);
}

OrderedServer::OrderedServer(dist::RpcGroup group, std::string name, std::optional<dist::Milliseconds> timeout)
    : group_(std::move(group)), name_(std::move(name)), timeout_(timeout) {
  PUSH_CHECK(!name_.empty(), kOrderedClient, "the server needs a name");
}

c10::IValue OrderedServer::call(const std::string& service, const char* what, dist::RpcArgs args) const {
  try {
    return group_.registered_sync(service, std::move(args), timeout_);
  } catch (const std::exception& e) {
    throw Error(c10::str("[", kOrderedClient, "] ", what, " on server '", name_, "': ", e.what()));
  }
}

bool OrderedServer::push(const std::string& key, c10::IValue value, int64_t version,
                         std::optional<int64_t> prev_version) const {
  check_versions(kOrderedClient, name_, key, version, prev_version);
  return call(push_service(name_), "push",
              {key, std::move(value), version, prev_version ? c10::IValue(*prev_version) : c10::IValue()})
      .toBool();
}

std::optional<Versioned> OrderedServer::pull(const std::string& key, std::optional<int64_t> version) const {
  auto reply = call(pull_service(name_), "pull", {key, version ? c10::IValue(*version) : c10::IValue()});
  if (reply.isNone()) return std::nullopt;
  const auto& t = reply.toTupleRef().elements();
  return Versioned{t.at(0), t.at(1).toInt()};
}

}  // namespace push::server
