// Store: the job's c10d store behind a push handle; c10d's failures become push::Errors.
#include "dist/world_access.h"

namespace push::dist {
namespace {

/// Runs `call` on the store of `state`; a failure becomes a push::Error naming Store::`what`.
template <class Call>
auto guarded(const std::shared_ptr<detail::StoreState>& state, const char* what, Call&& call) {
  const std::string origin = c10::str("push::dist::Store::", what);
  PUSH_CHECK(state, origin, "this store handle is empty (default-constructed)");
  try {
    return call(*state->store);
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] ", detail::current_message()));
  }
}

}  // namespace

void Store::set(const std::string& key, const std::vector<uint8_t>& value) const {
  guarded(state_, "set", [&](c10d::Store& s) { s.set(key, value); });
}

std::vector<uint8_t> Store::get(const std::string& key) const {
  return guarded(state_, "get", [&](c10d::Store& s) { return s.get(key); });
}

bool Store::check(const std::vector<std::string>& keys) const {
  return guarded(state_, "check", [&](c10d::Store& s) { return s.check(keys); });
}

void Store::wait(const std::vector<std::string>& keys) const {
  guarded(state_, "wait", [&](c10d::Store& s) { s.wait(keys); });
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) const {
  // c10d reads 0 ms as "no timeout": never hand it a 0.
  guarded(state_, "wait", [&](c10d::Store& s) { s.wait(keys, std::max(timeout, std::chrono::milliseconds(1))); });
}

int64_t Store::add(const std::string& key, int64_t delta) const {
  return guarded(state_, "add", [&](c10d::Store& s) { return s.add(key, delta); });
}

}  // namespace push::dist
