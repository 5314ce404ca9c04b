// An RPC group's lifetime: joining the members (listening, publishing this member's
// address, dialing the others, meeting them), and leaving them at shutdown.
#include "dist/rpc/rpc_state.h"

#include <algorithm>
#include <iostream>
#include "dist/rendezvous/sealed_value.h"
#include "dist/transport/rpc_origin.h"
#include "dist/world_access.h"

namespace push::dist::detail {

RpcState::RpcState(World world, std::string name, std::vector<int> members, Milliseconds timeout, std::string prefix,
                   c10::intrusive_ptr<c10d::Store> store, std::unique_ptr<StoreBarrier> barrier)
    : world_(std::move(world)),
      name_(std::move(name)),
      members_(std::move(members)),
      group_rank_(static_cast<int>(std::find(members_.begin(), members_.end(), world_.rank()) - members_.begin())),
      timeout_(timeout),
      prefix_(std::move(prefix)),
      store_(std::move(store)),
      barrier_(std::move(barrier)),
      holders_(store_, prefix_, world_.rank()) {}

RpcState::~RpcState() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
  }
}

std::string RpcState::member_name(int peer) const { return world_.names().at(members_.at(peer)); }

std::string RpcState::describe(int peer) const {
  return c10::str(member_name(peer), " (rank ", members_.at(peer), ")");
}

int RpcState::group_rank_of_global(int global, const char* origin) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), global);
  PUSH_CHECK(it != members_.end() && *it == global, origin, "rank ", global, " is not a member of RPC group '", name_,
             "' (members: ", member_list(), ")");
  return static_cast<int>(it - members_.begin());
}

std::string RpcState::member_list() const {
  std::vector<std::string> names;
  for (int r : members_) names.push_back(world_.names().at(r));
  return c10::Join(", ", names);
}

void RpcState::connect(Milliseconds init_timeout, const c10::intrusive_ptr<c10d::Store>& waiter, const WorldOptions& wo,
                       const RpcGroupOptions& options) {
  const int handler_threads = options.handler_threads();
  const auto deadline = Clock::deadline_after(init_timeout);
  TransportOptions to;
  key_ = handshake::group_key(WorldAccess::state(world_).secret, prefix_);
  to.key = key_;
  to.heartbeat_timeout = options.heartbeat_timeout();
  to.handshake_timeout =
      options.handshake_timeout().value_or(std::min<Milliseconds>(init_timeout, std::chrono::seconds(10)));
  to.rank = group_rank_;
  to.size = static_cast<int>(members_.size());
  to.max_message_bytes = options.max_message_bytes();
  to.receive_pool_bytes = options.receive_pool_bytes();
  to.shared_memory = options.shared_memory();
  to.ring_slots =
      static_cast<uint32_t>(std::clamp<std::size_t>(options.shared_memory_bytes() / to.ring_slot_bytes, 2, 4096));
  to.send_timeout = timeout_;
  for (int r : members_) to.names.push_back(world_.names().at(r));
  round_trips_ = std::make_unique<RoundTrips>(to.size, options.reply_spin());
  TransportCallbacks cb;
  cb.request = [this](ConnectionPtr from, int peer, const wire::Header& h, c10::IValue v, std::exception_ptr e) {
    on_request(std::move(from), peer, h, std::move(v), std::move(e));
  };
  cb.reply = [this](int peer, const wire::Header& h, c10::IValue v, std::exception_ptr e) {
    on_reply(peer, h, std::move(v), std::move(e));
  };
  cb.peer_lost = [this](int peer, const std::string& why) { on_peer_lost(peer, why); };
  cb.peer_found = [this](int peer) {
    lost_.found(peer);
    WorldAccess::state(world_).mark_lost(members_.at(static_cast<size_t>(peer)), false);
  };
  cb.tick = [this] { return expire(); };
  transport_ = std::make_unique<Transport>(std::move(to), std::move(cb));
  const std::string address = transport_->listen(advertised_host(wo.master_addr(), wo.master_port(), wo.interface()));
  // "host:port identity": members with this host's identity are reached through shared memory too.
  const std::string key = c10::str(prefix_, "addr/", group_rank_);
  store_->set(key, string_to_bytes(seal(key_, key, address + " " + host_identity())));
  started_ = true;
  try {
    join_members(deadline, init_timeout, waiter, handler_threads);
  } catch (...) {
    // Never joined: leave without shutdown's barrier, which the others would never reach.
    stopping_ = true;
    transport_->stop();
    loops_.stop();
    stopped_ = true;
    throw;
  }
}

void RpcState::join_members(Clock::time_point deadline, Milliseconds init_timeout,
                            const c10::intrusive_ptr<c10d::Store>& waiter, int handler_threads) {
  loops_.start(handler_threads, name_, [this](std::exception_ptr error) {
    if (stopping_) return;  // cancelled by shutdown: its caller's call fails there
    std::cerr << "[" << kRpcOrigin << "] " << world_.name() << ": " << push::detail::describe(error) << "\n";
  });
  transport_->start();
  for (int peer = 0; peer < static_cast<int>(members_.size()); ++peer) {
    if (peer == group_rank_) continue;
    const std::string key = c10::str(prefix_, "addr/", peer);
    const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
    try {
      waiter->wait({key}, std::max(left, Milliseconds(1)));
    } catch (const std::exception&) {
      throw Error(c10::str("[push::dist::World::rpc_group] ", world_.name(), ": ", describe(peer),
                           " did not join RPC group '", name_, "' within ", init_timeout.count(),
                           " ms (init_timeout)"));
    }
    const std::string published =
        unseal(key_, key, bytes_to_string(waiter->get(key)), c10::str("the address of ", describe(peer)));
    const auto space = published.find(' ');
    transport_->connect(peer, published.substr(0, space),
                        space == std::string::npos ? std::string() : published.substr(space + 1), deadline);
  }
  const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
  barrier_->arrive_and_wait(std::max(left, Milliseconds(1)), "push::dist::World::rpc_group");
  transport_->watch_heartbeats();  // every member has dialed every other
}

void RpcState::barrier(Milliseconds timeout) { barrier_->arrive_and_wait(timeout, "push::dist::RpcGroup::barrier"); }

void RpcState::check_not_own_handler(const char* what) const {
  PUSH_CHECK(!loops_.is_own_thread(), kRpcOrigin, "group '", name_, "' cannot ", what,
             " from one of its own handlers (they run on its event loops)");
}

void RpcState::shutdown() {
  check_not_own_handler("be shut down");
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (stopped_) return;
  stopped_ = true;
  if (!started_) return;
  leaving_ = true;
  std::exception_ptr error;
  // A lost member never reaches the barrier: it opens when the others have arrived
  // (asking again while it waits: another member may learn of a loss before this one).
  // Rank 0 hosts the store (unless a launcher does): once it is stopped or cut off, the
  // store cannot hold a barrier, and waiting on it would wait for the store's own timeouts
  // (none under LibTorch 1.13). A rank 0 that merely left after the barrier is not silent.
  const bool store_here =
      !WorldAccess::state(world_).options.launcher_hosts_store() && members_.front() == 0 && group_rank_ != 0;
  std::function<bool()> store_lost;
  if (store_here) store_lost = [this] { return transport_->silent(0); };
  try {
    barrier_->arrive_and_wait_for_live(
        group_rank_, timeout_, "push::dist::RpcGroup::shutdown", [this] { return lost_.members(); }, store_lost);
  } catch (...) {
    error = std::current_exception();
  }
  stopping_ = true;
  transport_->stop();
  loops_.stop();
  for (auto& p : calls_.take_all()) {
    p.promise.set_error(std::make_exception_ptr(
        CancelledError(c10::str("[", kRpcOrigin, "] ", p.what, ": group '", name_, "' shut down before the reply"))));
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace push::dist::detail
