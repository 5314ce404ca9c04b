#include "dist/rpc/key_holders.h"

#include "dist/c10d.h"

namespace push::dist::detail {

KeyHolders::KeyHolders(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank)
    : store_(std::move(store)), prefix_(std::move(prefix)), mine_(std::to_string(rank)) {}

std::string KeyHolders::store_key(const char* kind, const std::string& key) const {
  return c10::str(prefix_, kind, "/", key);
}

int KeyHolders::claim(const char* kind, const std::string& key) {
  const auto got = bytes_to_string(store_->compareSet(store_key(kind, key), {}, string_to_bytes(mine_)));
  return got == mine_ ? -1 : std::stoi(got);
}

void KeyHolders::release(const char* kind, const std::string& key) {
  store_->compareSet(store_key(kind, key), string_to_bytes(mine_), {});
}

int KeyHolders::lookup(const char* kind, const std::string& key, bool fresh) {
  const auto k = store_key(kind, key);
  if (!fresh) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = holders_.find(k);
    if (it != holders_.end()) return it->second;
  }
  int holder = -1;
  if (store_->check({k})) {
    const auto value = bytes_to_string(store_->get(k));
    if (!value.empty()) holder = std::stoi(value);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (holder >= 0)
    holders_[k] = holder;
  else
    holders_.erase(k);
  return holder;
}

}  // namespace push::dist::detail
