#pragma once
// The state behind an RpcGroup handle: the transport (transport.h), the calls waiting for
// replies, what this member serves (services, paired values, remote() results), and the
// event loops whose fibers run incoming requests.
#include "c10d.h"
#include "core/event_loop.h"
#include "transport.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace push::dist::detail {

using push::detail::EventLoop;

struct Pending {
  Promise<c10::IValue> promise;
  Clock::time_point deadline;
  int to = -1;  // group rank
  std::string what;
  std::multimap<Clock::time_point, int64_t>::iterator timer;
  /// Service and paired-value calls: sent again to the key's new holder when the one this
  /// member remembered answers that it no longer holds it.
  struct Retry {
    const char* kind = nullptr;  // "service" or "paired"
    std::string key;
    uint16_t type = 0;
    std::shared_ptr<const wire::Encoded> body;
  };
  std::optional<Retry> retry;
};

struct Served {
  bool ok = true;
  c10::IValue value;   // the result, or the error message
  uint16_t flags = 0;  // wire::kOwnedValue, kNotHere
};

struct RpcState {
  explicit RpcState(World w) : world(std::move(w)) {}
  ~RpcState();

  World world;
  std::string name;
  std::vector<int> members;  // global ranks, ascending; a member's group rank is its index
  int group_rank = -1;
  Milliseconds timeout{0};
  std::string prefix;
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<StoreBarrier> barrier;
  std::unique_ptr<Transport> transport;

  std::mutex pending_mutex;
  std::map<int64_t, Pending> pending;
  std::multimap<Clock::time_point, int64_t> deadlines;
  int64_t next_call = 0;

  std::mutex table_mutex;
  std::map<std::string, RpcFunction> services;
  std::map<std::string, c10::IValue> paired;
  std::map<int64_t, c10::IValue> owned;  // remote() results held for their RRefs
  int64_t next_owned = 0;
  std::map<std::string, int> owners;     // "kind/key" -> global rank, as last seen in the store

  // Incoming requests run as fibers on these loops (round robin), so a handler that waits
  // for another call (to any member, itself included) suspends instead of holding a thread.
  std::vector<std::shared_ptr<EventLoop>> loops;
  std::atomic<uint64_t> next_loop{0};

  // Members whose connection closed before shutdown, and who wants to hear of it.
  std::mutex lost_mutex;
  std::map<int, std::string> lost;  // group rank -> why
  std::vector<std::function<void(int, const std::string&)>> lost_listeners;

  std::atomic<bool> stopping{false};
  std::mutex shutdown_mutex;
  bool started = false;  // false when construction failed half-way: nothing to stop
  bool stopped = false;

  std::string member_name(int group_rank_of) const;
  std::string describe(int group_rank_of) const;  // "worker1 (rank 1)"
  int group_rank_of_global(int global, const char* origin) const;
  std::string member_list() const;

  /// Listens, publishes this member's address, dials the others and meets them at a
  /// barrier, all within `init_timeout`; `waiter` is a store client for the blocking waits.
  void connect(Milliseconds init_timeout, const c10::intrusive_ptr<c10d::Store>& waiter,
               const WorldOptions& world_options, const RpcGroupOptions& options);
  void join_members(Clock::time_point deadline, Milliseconds init_timeout,
                    const c10::intrusive_ptr<c10d::Store>& waiter, int handler_threads);
  void shutdown();

  // Calls (rpc_calls.cpp).
  Future<c10::IValue> call(int to, uint16_t type, const c10::IValue& body, Milliseconds timeout,
                           std::string what, std::optional<Pending::Retry> retry = std::nullopt);
  void send_pending(Pending p, uint16_t type, std::shared_ptr<const wire::Encoded> encoded);
  /// Sends without waiting for a reply (releases of remote values).
  void notify(int to, uint16_t type, const c10::IValue& body);
  void on_reply(int peer, const wire::Header& header, c10::IValue value, std::exception_ptr error);
  void on_peer_lost(int peer, const std::string& why);
  void fail_pending_on(int peer, const std::string& why);
  std::optional<Clock::time_point> expire();
  std::optional<Pending> take(int64_t id, int from);
  void fail(int64_t id, std::exception_ptr error);

  // Serving (rpc_serve.cpp).
  void on_request(ConnectionPtr from, int peer, const wire::Header& header, c10::IValue value,
                  std::exception_ptr error);
  Served serve(uint16_t type, const c10::IValue& body);
  /// Runs `job` as a fiber on one of the loops: `peer`'s loop for its requests, else the
  /// next one round robin.
  void enqueue(std::function<void()> job, int peer = -1);
  void stop_loops();
  /// Throws when called on one of this group's loops (shutdown would wait for itself).
  void check_not_own_handler(const char* what) const;

  // Holders of keys (rpc.cpp).
  int lookup_owner(const char* kind, const std::string& key, bool fresh);
};

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
