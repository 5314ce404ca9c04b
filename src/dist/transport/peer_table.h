#pragma once
// The transport's connections, with the lock that guards them: every open one (the I/O
// thread closes them), and by group rank the one this member dialed, where to dial again,
// and whether shared-memory rings apply.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace push::dist::detail {

class Connection;
using ConnectionPtr = std::shared_ptr<Connection>;

class PeerTable {
 public:
  explicit PeerTable(int members);

  /// `peer` answered at `address` on `c`, dialed by this member; rings apply when `rings`.
  void connected(int peer, const std::string& address, bool rings, ConnectionPtr c);
  /// The connection this member dialed to `peer`; null once it was lost.
  ConnectionPtr outgoing(int peer) const;
  /// Held by the one caller that dials `peer` again after its connection was lost.
  std::mutex& redial_mutex(int peer) { return *redial_.at(static_cast<std::size_t>(peer)); }
  /// Where `peer` listens.
  std::string address(int peer) const;
  /// A lost connection to `peer` dialed again.
  void redialed(int peer, ConnectionPtr c);
  /// Whether large messages to `peer` go through shared memory.
  bool rings(int peer) const;

  /// An open connection.
  void add(ConnectionPtr c);
  /// `c` closed; true when it was the connection this member dialed to its peer (now lost).
  bool remove(const Connection* c);
  /// The connections this member dialed (null where lost).
  std::vector<ConnectionPtr> outgoing_all() const;
  /// The introduced connections `peer` dialed to this member.
  std::vector<ConnectionPtr> incoming_from(int peer) const;
  /// Every open connection, taken out (the transport stops).
  std::vector<ConnectionPtr> take_all();

 private:
  mutable std::mutex mutex_;  // guards every member below but redial_
  std::vector<ConnectionPtr> outgoing_;
  std::vector<std::string> addresses_;
  std::vector<char> rings_;
  std::vector<ConnectionPtr> all_;
  std::vector<std::unique_ptr<std::mutex>> redial_;  // fixed at construction
};

}  // namespace push::dist::detail
