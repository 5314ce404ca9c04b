#include "dist/rpc/lost_members.h"

namespace push::dist::detail {

std::vector<LostMembers::Listener> LostMembers::lose(int peer, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.emplace(peer, why);
  return listeners_;
}

void LostMembers::found(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.erase(peer);
}

std::map<int, std::string> LostMembers::listen(Listener listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  listeners_.push_back(std::move(listener));
  return lost_;
}

std::set<int> LostMembers::members() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<int> out;
  for (const auto& entry : lost_) out.insert(entry.first);
  return out;
}

}  // namespace push::dist::detail
