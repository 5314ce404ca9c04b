#pragma once
// The state behind an RpcGroup handle: who the group is, and the parts it wires together.
// The transport (transport.h) carries the frames; PendingCalls waits for the replies;
// ServedValues is what this member serves and KeyHolders who holds each key; HandlerLoops
// run the incoming requests as fibers; LostMembers is who is gone. Creation and shutdown
// are in rpc_state.cpp, calls and replies in rpc_calls.cpp, requests in rpc_serve.cpp.
#include "dist/c10d.h"
#include "dist/rpc/handler_loops.h"
#include "dist/rpc/key_holders.h"
#include "dist/rpc/lost_members.h"
#include "dist/rpc/pending_calls.h"
#include "dist/rpc/round_trips.h"
#include "dist/rpc/served_values.h"
#include "dist/transport/transport.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace push::dist::detail {

/// What serving a request gave: its reply.
struct Served {
  bool ok = true;
  c10::IValue value;   // the result, or the error message
  uint16_t flags = 0;  // wire::kOwnedValue, kNotHere
};

class RpcState {
 public:
  /// The group `name` of `members` (global ranks, ascending; this rank among them), whose
  /// calls time out after `timeout` unless told otherwise and whose keys in `store` start
  /// with `prefix`. connect() then joins it.
  RpcState(World world, std::string name, std::vector<int> members, Milliseconds timeout, std::string prefix,
           c10::intrusive_ptr<c10d::Store> store, std::unique_ptr<StoreBarrier> barrier);
  /// shutdown(), reporting (not throwing) its error.
  ~RpcState();
  RpcState(const RpcState&) = delete;
  RpcState& operator=(const RpcState&) = delete;

  const World& world() const { return world_; }
  const std::string& name() const { return name_; }
  /// Global ranks, ascending: a member's group rank is its index.
  const std::vector<int>& members() const { return members_; }
  int group_rank() const { return group_rank_; }
  Milliseconds timeout() const { return timeout_; }
  /// Of the group's keys in the store; its connections' key derives from it (handshake.h).
  const std::string& prefix() const { return prefix_; }
  /// The key its connections prove they hold (handshake.h).
  const handshake::Bytes& key() const { return key_; }
  /// The port this member listens on.
  int port() const { return transport_->port(); }

  std::string member_name(int peer) const;
  std::string describe(int peer) const;  // "worker1 (rank 1)"
  int group_rank_of_global(int global, const char* origin) const;
  std::string member_list() const;

  ServedValues& served() { return served_; }
  KeyHolders& holders() { return holders_; }
  LostMembers& lost() { return lost_; }
  /// Null before connect().
  const RoundTrips* round_trips() const { return round_trips_.get(); }

  /// Listens, publishes this member's address, dials the others and meets them at a
  /// barrier, all within `init_timeout`; `waiter` is a store client for the blocking waits.
  void connect(Milliseconds init_timeout, const c10::intrusive_ptr<c10d::Store>& waiter,
               const WorldOptions& world_options, const RpcGroupOptions& options);
  /// RpcGroup::barrier.
  void barrier(Milliseconds timeout);
  /// A barrier of the members not known to be lost, then every thread stops and the calls
  /// still waiting fail with CancelledError. Idempotent; not from one of the group's handlers.
  void shutdown();
  bool stopping() const { return stopping_; }

  // Calls (rpc_calls.cpp).
  /// Sends a request of `type` to group rank `to`; the future fails after `timeout`.
  Future<c10::IValue> call(int to, uint16_t type, const c10::IValue& body, Milliseconds timeout, std::string what,
                           std::optional<Pending::Retry> retry = std::nullopt);
  /// Tells group rank `owner` to drop the value it keeps under `id` for a remote() handle:
  /// from a handler fiber, never from the I/O thread, which must not block on a send.
  void release_remote(int owner, c10::IValue id);

 private:
  void join_members(Clock::time_point deadline, Milliseconds init_timeout,
                    const c10::intrusive_ptr<c10d::Store>& waiter, int handler_threads);
  /// Throws when called on one of this group's loops (shutdown would wait for itself).
  void check_not_own_handler(const char* what) const;

  // Calls (rpc_calls.cpp).
  void send_pending(Pending p, uint16_t type, std::shared_ptr<const wire::Encoded> encoded);
  /// Sends without waiting for a reply (releases of remote values).
  void notify(int to, uint16_t type, const c10::IValue& body);
  void on_reply(int peer, const wire::Header& header, c10::IValue value, std::exception_ptr error);
  /// The key of a service or paired-value call moved: sends it to the key's holder now.
  void send_to_new_holder(std::shared_ptr<Pending> moved);
  void on_peer_lost(int peer, const std::string& why);
  /// Fails the calls whose deadline passed; the nearest deadline left.
  std::optional<Clock::time_point> expire();

  // Serving (rpc_serve.cpp).
  void on_request(ConnectionPtr from, int peer, const wire::Header& header, c10::IValue value,
                  std::exception_ptr error);
  Served serve(uint16_t type, const c10::IValue& body);

  const World world_;
  const std::string name_;
  const std::vector<int> members_;
  const int group_rank_;
  const Milliseconds timeout_;
  const std::string prefix_;
  handshake::Bytes key_{};  // set by connect()
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::unique_ptr<StoreBarrier> barrier_;
  std::unique_ptr<Transport> transport_;

  PendingCalls calls_;
  std::unique_ptr<RoundTrips> round_trips_;  // set by connect(), before any call
  ServedValues served_;
  KeyHolders holders_;
  HandlerLoops loops_;
  LostMembers lost_;

  std::atomic<bool> stopping_{false};
  // Set as this member enters shutdown's barrier: every member has entered it before any
  // leaves it and closes its connections, so a connection that closes from then on is a
  // member leaving, not lost (the World is not told: rank 0 waits for it to leave).
  std::atomic<bool> leaving_{false};
  std::mutex shutdown_mutex_;
  bool started_ = false;  // false when construction failed half-way: nothing to stop
  bool stopped_ = false;
};

/// The state behind an RRef handle.
struct RRefState {
  std::weak_ptr<RpcState> group;
  int owner = -1;  // group rank
  int owner_global = -1;
  std::string owner_name;
  Milliseconds timeout{0};
  bool paired = false;  // a paired value: lives until unpaired, never released from here
  std::string key;
  Future<c10::IValue> id;  // remote(): the value's id on the owner, once it has it
  ~RRefState();
};

}  // namespace push::dist::detail
