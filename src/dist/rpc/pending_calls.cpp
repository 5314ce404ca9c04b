#include "dist/rpc/pending_calls.h"

namespace push::dist::detail {

PendingCalls::Added PendingCalls::add(Pending call) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  const auto nearest = deadlines_.next();
  // A deadline equal to the nearest one sorts after it: that one's wake-up serves both.
  const bool earliest = !nearest || call.deadline < *nearest;
  auto timer = deadlines_.add(call.deadline, id);
  calls_.emplace(id, Entry{std::move(call), timer});
  return {id, earliest};
}

std::optional<Pending> PendingCalls::take(int64_t id, int from) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it == calls_.end() || (from >= 0 && it->second.call.to != from)) return std::nullopt;
  deadlines_.cancel(it->second.timer);
  Pending call = std::move(it->second.call);
  calls_.erase(it);
  return call;
}

std::vector<Pending> PendingCalls::take_to(int peer) {
  std::vector<Pending> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.call.to == peer) {
      deadlines_.cancel(it->second.timer);
      out.push_back(std::move(it->second.call));
      it = calls_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<Pending> PendingCalls::take_all() {
  std::map<int64_t, Entry> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.swap(calls_);
    deadlines_.clear();
  }
  std::vector<Pending> out;
  for (auto& [id, entry] : all) out.push_back(std::move(entry.call));
  return out;
}

PendingCalls::Expired PendingCalls::expire(Clock::time_point now) {
  Expired out;
  std::lock_guard<std::mutex> lock(mutex_);
  while (auto id = deadlines_.pop_expired(now)) {
    auto it = calls_.find(*id);
    if (it == calls_.end()) continue;
    out.calls.push_back(std::move(it->second.call));
    calls_.erase(it);
  }
  out.next = deadlines_.next();
  return out;
}

}  // namespace push::dist::detail
