#include "dist/rpc/served_values.h"

namespace push::dist::detail {

bool ServedValues::add_service(const std::string& key, RpcFunction handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  return services_.emplace(key, std::move(handler)).second;
}

RpcFunction ServedValues::remove_service(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = services_.find(key);
  if (it == services_.end()) return {};
  RpcFunction gone = std::move(it->second);
  services_.erase(it);
  return gone;
}

RpcFunction ServedValues::service(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = services_.find(key);
  return it == services_.end() ? RpcFunction() : it->second;
}

bool ServedValues::add_paired(const std::string& key, c10::IValue value) {
  std::lock_guard<std::mutex> lock(mutex_);
  return paired_.emplace(key, std::move(value)).second;
}

bool ServedValues::remove_paired(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return paired_.erase(key) == 1;
}

std::optional<c10::IValue> ServedValues::paired(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = paired_.find(key);
  if (it == paired_.end()) return std::nullopt;
  return it->second;
}

int64_t ServedValues::keep(c10::IValue value) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  kept_.emplace(id, std::move(value));
  return id;
}

std::optional<c10::IValue> ServedValues::kept(int64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = kept_.find(id);
  if (it == kept_.end()) return std::nullopt;
  return it->second;
}

bool ServedValues::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.erase(id) == 1;
}

size_t ServedValues::kept_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.size();
}

}  // namespace push::dist::detail
