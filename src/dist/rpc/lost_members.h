#pragma once
// The members of an RPC group whose connection closed before the group shut down (they
// died, left, or sent bytes that are not frames), and who wants to hear of each loss.
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace push::dist::detail {

/// Thread-safe. Members are group ranks here; listeners get whatever their adder maps them to.
class LostMembers {
 public:
  using Listener = std::function<void(int, const std::string&)>;

  /// Records that `peer` was lost; returns the listeners to tell, for the caller to call
  /// outside the lock.
  std::vector<Listener> lose(int peer, const std::string& why);
  /// Adds a listener; returns the members lost before it (peer -> why), to tell it of now.
  std::map<int, std::string> listen(Listener listener);
  /// `peer` answered again (a later call dialed it): it is no longer listed as lost.
  void found(int peer);
  /// The members lost so far.
  std::set<int> members() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, std::string> lost_;  // group rank -> why
  std::vector<Listener> listeners_;
};

}  // namespace push::dist::detail
