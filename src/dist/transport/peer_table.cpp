#include "dist/transport/peer_table.h"

#include <algorithm>

#include "dist/transport/connection.h"

namespace push::dist::detail {

PeerTable::PeerTable(int members)
    : outgoing_(static_cast<std::size_t>(members)),
      addresses_(static_cast<std::size_t>(members)),
      rings_(static_cast<std::size_t>(members), 0) {
  for (int i = 0; i < members; ++i) redial_.push_back(std::make_unique<std::mutex>());
}

void PeerTable::connected(int peer, const std::string& address, bool rings, ConnectionPtr c) {
  std::lock_guard<std::mutex> lock(mutex_);
  rings_.at(static_cast<std::size_t>(peer)) = rings ? 1 : 0;
  addresses_[static_cast<std::size_t>(peer)] = address;
  outgoing_[static_cast<std::size_t>(peer)] = std::move(c);
}

ConnectionPtr PeerTable::outgoing(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outgoing_.at(static_cast<std::size_t>(peer));
}

std::string PeerTable::address(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return addresses_.at(static_cast<std::size_t>(peer));
}

void PeerTable::redialed(int peer, ConnectionPtr c) {
  std::lock_guard<std::mutex> lock(mutex_);
  outgoing_.at(static_cast<std::size_t>(peer)) = std::move(c);
}

bool PeerTable::rings(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peer >= 0 && peer < static_cast<int>(rings_.size()) && rings_[static_cast<std::size_t>(peer)] != 0;
}

void PeerTable::add(ConnectionPtr c) {
  std::lock_guard<std::mutex> lock(mutex_);
  all_.push_back(std::move(c));
}

bool PeerTable::remove(const Connection* c) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(all_.begin(), all_.end(), [&](const ConnectionPtr& p) { return p.get() == c; });
  if (it != all_.end()) all_.erase(it);
  if (c->outgoing() && c->peer() >= 0 && outgoing_[static_cast<std::size_t>(c->peer())].get() == c) {
    outgoing_[static_cast<std::size_t>(c->peer())].reset();
    return true;
  }
  return false;
}

std::vector<ConnectionPtr> PeerTable::outgoing_all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outgoing_;
}

std::vector<ConnectionPtr> PeerTable::incoming_from(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ConnectionPtr> in;
  for (const auto& c : all_) {
    if (!c->outgoing() && c->introduced() && c->peer() == peer) in.push_back(c);
  }
  return in;
}

std::vector<ConnectionPtr> PeerTable::take_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ConnectionPtr> left;
  left.swap(all_);
  for (auto& c : outgoing_) c.reset();
  return left;
}

}  // namespace push::dist::detail
