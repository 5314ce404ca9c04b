// RpcGroup's calling side: connecting the members, sending requests, matching replies,
// deadlines, lost peers and shutdown.
#include "rpc_state.h"

#include <algorithm>
#include <iostream>

namespace push::dist::detail {

namespace {
constexpr const char* kOrigin = "push::dist::RpcGroup";
}  // namespace

RpcState::~RpcState() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
  }
}

std::string RpcState::member_name(int group_rank_of) const {
  return world.names().at(members.at(group_rank_of));
}

std::string RpcState::describe(int group_rank_of) const {
  return c10::str(member_name(group_rank_of), " (rank ", members.at(group_rank_of), ")");
}

int RpcState::group_rank_of_global(int global, const char* origin) const {
  auto it = std::lower_bound(members.begin(), members.end(), global);
  PUSH_CHECK(it != members.end() && *it == global, origin, "rank ", global,
             " is not a member of RPC group '", name, "' (members: ", member_list(), ")");
  return static_cast<int>(it - members.begin());
}

std::string RpcState::member_list() const {
  std::vector<std::string> names;
  for (int r : members) names.push_back(world.names().at(r));
  return c10::Join(", ", names);
}

void RpcState::connect(Milliseconds init_timeout, const c10::intrusive_ptr<c10d::Store>& waiter,
                       const WorldOptions& wo, const RpcGroupOptions& options) {
  const int handler_threads = options.handler_threads();
  const auto deadline = Clock::now() + init_timeout;
  TransportOptions to;
  to.token = prefix;
  to.rank = group_rank;
  to.size = static_cast<int>(members.size());
  to.max_message_bytes = options.max_message_bytes();
  to.receive_pool_bytes = options.receive_pool_bytes();
  to.shared_memory = options.shared_memory();
  to.ring_slots = static_cast<uint32_t>(std::clamp<std::size_t>(options.shared_memory_bytes() / to.ring_slot_bytes, 2, 4096));
  to.send_timeout = timeout;
  for (int r : members) to.names.push_back(world.names().at(r));
  TransportCallbacks cb;
  cb.request = [this](ConnectionPtr from, int peer, const wire::Header& h, c10::IValue v,
                      std::exception_ptr e) { on_request(std::move(from), peer, h, std::move(v), std::move(e)); };
  cb.reply = [this](int peer, const wire::Header& h, c10::IValue v, std::exception_ptr e) {
    on_reply(peer, h, std::move(v), std::move(e));
  };
  cb.peer_lost = [this](int peer, const std::string& why) { on_peer_lost(peer, why); };
  cb.tick = [this] { return expire(); };
  transport = std::make_unique<Transport>(std::move(to), std::move(cb));
  const std::string address =
      transport->listen(advertised_host(wo.master_addr(), wo.master_port(), wo.interface()));
  // "host:port identity": members with this host's identity are reached through shared memory too.
  store->set(c10::str(prefix, "addr/", group_rank), string_to_bytes(address + " " + host_identity()));
  started = true;
  try {
    join_members(deadline, init_timeout, waiter, handler_threads);
  } catch (...) {
    // Never joined: leave without shutdown's barrier, which the others would never reach.
    stopping = true;
    transport->stop();
    stop_loops();
    stopped = true;
    throw;
  }
}

void RpcState::join_members(Clock::time_point deadline, Milliseconds init_timeout,
                            const c10::intrusive_ptr<c10d::Store>& waiter, int handler_threads) {
  for (int i = 0; i < handler_threads; ++i) {
    EventLoop::Options o;
    o.name = "push-rpc";
    o.stopped = c10::str("RPC group '", name, "' was shut down");
    loops.push_back(std::make_shared<EventLoop>(std::move(o)));
    loops.back()->start();
  }
  transport->start();
  for (int peer = 0; peer < static_cast<int>(members.size()); ++peer) {
    if (peer == group_rank) continue;
    const std::string key = c10::str(prefix, "addr/", peer);
    const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
    try {
      waiter->wait({key}, std::max(left, Milliseconds(1)));
    } catch (const std::exception&) {
      throw Error(c10::str("[push::dist::World::rpc_group] ", world.name(), ": ", describe(peer),
                           " did not join RPC group '", name, "' within ", init_timeout.count(),
                           " ms (init_timeout)"));
    }
    const std::string published = bytes_to_string(waiter->get(key));
    const auto space = published.find(' ');
    transport->connect(peer, published.substr(0, space),
                       space == std::string::npos ? std::string() : published.substr(space + 1), deadline);
  }
  const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
  barrier->arrive_and_wait(std::max(left, Milliseconds(1)), "push::dist::World::rpc_group");
}

void RpcState::shutdown() {
  check_not_own_handler("be shut down");
  std::lock_guard<std::mutex> lock(shutdown_mutex);
  if (stopped) return;
  stopped = true;
  if (!started) return;
  std::exception_ptr error;
  // A lost member never reaches the barrier: it opens when the others have arrived
  // (asking again while it waits: another member may learn of a loss before this one).
  try {
    barrier->arrive_and_wait_for_live(group_rank, timeout, "push::dist::RpcGroup::shutdown", [this] {
      std::lock_guard<std::mutex> lock(lost_mutex);
      std::set<int> out;
      for (const auto& entry : lost) out.insert(entry.first);
      return out;
    });
  } catch (...) {
    error = std::current_exception();
  }
  stopping = true;
  transport->stop();
  stop_loops();
  std::map<int64_t, Pending> left;
  {
    std::lock_guard<std::mutex> l(pending_mutex);
    left.swap(pending);
    deadlines.clear();
  }
  for (auto& [id, p] : left) {
    p.promise.set_error(std::make_exception_ptr(CancelledError(c10::str(
        "[", kOrigin, "] ", p.what, ": group '", name, "' shut down before the reply"))));
  }
  if (error) std::rethrow_exception(error);
}

// -- sending -------------------------------------------------------------------------------

Future<c10::IValue> RpcState::call(int to, uint16_t type, const c10::IValue& body, Milliseconds call_timeout,
                                   std::string what, std::optional<Pending::Retry> retry) {
  PUSH_CHECK(!stopping, kOrigin, what, ": group '", name, "' is shut down");
  auto encoded = std::make_shared<const wire::Encoded>(wire::encode(body));
  if (retry) {
    retry->type = type;
    retry->body = encoded;
  }
  Pending p;
  auto future = p.promise.future();
  // A timeout too long to add to now (Milliseconds::max(): wait until the reply or the
  // member's loss) saturates instead of overflowing.
  const auto now = Clock::now();
  p.deadline = call_timeout >= std::chrono::duration_cast<Milliseconds>(Clock::time_point::max() - now)
                   ? Clock::time_point::max()
                   : now + call_timeout;
  p.to = to;
  p.what = std::move(what);
  p.retry = std::move(retry);
  send_pending(std::move(p), type, encoded);
  return future;
}

void RpcState::send_pending(Pending p, uint16_t type, std::shared_ptr<const wire::Encoded> encoded) {
  const int to = p.to;
  int64_t id;
  bool earliest;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    id = next_call++;
    p.timer = deadlines.emplace(p.deadline, id);
    earliest = p.timer == deadlines.begin();
    pending.emplace(id, std::move(p));
  }
  if (earliest) transport->wake();
  if (to == group_rank) {
    // A call to oneself takes the same path minus the wire: a handler fiber runs it on a
    // copy of the arguments and the caller gets a copy of the result, as from any member.
    enqueue([this, id, type, encoded] {
      Served served;
      try {
        std::vector<at::Tensor> copies;
        for (const auto& t : encoded->tensors) copies.push_back(t.clone());
        served = serve(type, wire::decode(encoded->meta, copies));
        served.value = wire::copy_value(served.value);
      } catch (const std::exception&) {
        served = Served{false, c10::IValue(current_message()), 0};
      }
      wire::Header h;
      h.type = served.ok ? wire::kReplyOk : wire::kReplyError;
      h.flags = served.flags;
      h.id = static_cast<uint64_t>(id);
      on_reply(group_rank, h, std::move(served.value), nullptr);
    });
    return;
  }
  try {
    wire::Header h;
    h.type = type;
    h.id = static_cast<uint64_t>(id);
    transport->send(to, h, *encoded);
  } catch (const std::exception&) {
    const std::string text = current_message();
    if (auto failed = take(id, -1)) {
      failed->promise.set_error(std::make_exception_ptr(Error(
          c10::str("[", kOrigin, "] ", failed->what, ": cannot send to ", describe(to), ": ", text))));
    }
  }
}

void RpcState::notify(int to, uint16_t type, const c10::IValue& body) {
  if (stopping) return;
  wire::Header h;
  h.type = type;
  h.flags = wire::kNoReply;
  if (to == group_rank) {
    enqueue([this, type, body] { serve(type, body); });
    return;
  }
  try {
    transport->send(to, h, wire::encode(body));
  } catch (const std::exception&) {
    // The peer is gone, and with it what it held for us.
  }
}

// -- replies -------------------------------------------------------------------------------

std::optional<Pending> RpcState::take(int64_t id, int from) {
  std::lock_guard<std::mutex> lock(pending_mutex);
  auto it = pending.find(id);
  // Gone (timed out already), or an id of a call to someone else: not this reply's call.
  if (it == pending.end() || (from >= 0 && it->second.to != from)) return std::nullopt;
  deadlines.erase(it->second.timer);
  Pending p = std::move(it->second);
  pending.erase(it);
  return p;
}

void RpcState::fail(int64_t id, std::exception_ptr error) {
  if (auto p = take(id, -1)) p->promise.set_error(std::move(error));
}

void RpcState::on_reply(int peer, const wire::Header& header, c10::IValue value, std::exception_ptr error) {
  auto p = take(static_cast<int64_t>(header.id), peer);
  if (!p) {
    // A late reply: its call timed out. A value the callee keeps for it is released.
    if (!error && header.type == wire::kReplyOk && (header.flags & wire::kOwnedValue) && value.isInt()) {
      enqueue([this, peer, value] { notify(peer, wire::kReleaseRRef, value); });
    }
    return;
  }
  if (error) {
    p->promise.set_error(std::make_exception_ptr(Error(c10::str(
        "[", kOrigin, "] ", p->what, ": malformed reply from ", describe(peer), ": ", push::detail::describe(error)))));
    return;
  }
  if (header.type == wire::kReplyOk) {
    p->promise.set_value(std::move(value));
    return;
  }
  if ((header.flags & wire::kNotHere) && p->retry) {
    // The key moved: ask the store who holds it now, and send the call there (once).
    auto moved = std::make_shared<Pending>(std::move(*p));
    enqueue([this, moved] {
      try {
        auto retry = std::move(*moved->retry);
        moved->retry.reset();
        const bool service = std::string(retry.kind) == "service";
        const int owner = lookup_owner(retry.kind, retry.key, /*fresh=*/true);
        PUSH_CHECK(owner >= 0, kOrigin, service ? "no service '" : "no value is paired under '",
                   retry.key, service ? "' is registered" : "'", " in group '", name, "'");
        moved->to = group_rank_of_global(owner, kOrigin);
        send_pending(std::move(*moved), retry.type, retry.body);
      } catch (const std::exception&) {
        moved->promise.set_error(std::current_exception());
      }
    });
    return;
  }
  const std::string message = value.isString() ? value.toStringRef() : "(unreadable error)";
  p->promise.set_error(std::make_exception_ptr(RemoteError(
      members[peer], member_name(peer), message,
      c10::str("[", kOrigin, "] ", p->what, " failed on ", describe(peer), ": ", message))));
}

void RpcState::on_peer_lost(int peer, const std::string& why) {
  std::vector<std::function<void(int, const std::string&)>> listeners;
  {
    std::lock_guard<std::mutex> lock(lost_mutex);
    lost.emplace(peer, why);
    listeners = lost_listeners;
  }
  fail_pending_on(peer, why);
  for (const auto& fn : listeners) {
    try {
      fn(members.at(static_cast<size_t>(peer)), why);
    } catch (const std::exception& e) {
      std::cerr << "[push::dist::RpcGroup] a member-lost callback threw: " << e.what() << "\n";
    }
  }
}

void RpcState::fail_pending_on(int peer, const std::string& why) {
  std::vector<Pending> lost;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second.to == peer) {
        deadlines.erase(it->second.timer);
        lost.push_back(std::move(it->second));
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : lost) {
    p.promise.set_error(std::make_exception_ptr(Error(c10::str(
        "[", kOrigin, "] ", p.what, ": lost the connection to ", describe(peer), " (", why,
        "): it died or left the group"))));
  }
}

std::optional<Clock::time_point> RpcState::expire() {
  std::vector<Pending> expired;
  std::optional<Clock::time_point> next;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    const auto now = Clock::now();
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      auto it = pending.find(deadlines.begin()->second);
      deadlines.erase(deadlines.begin());
      if (it == pending.end()) continue;
      expired.push_back(std::move(it->second));
      pending.erase(it);
    }
    if (!deadlines.empty()) next = deadlines.begin()->first;
  }
  for (auto& p : expired) {
    p.promise.set_error(std::make_exception_ptr(Error(c10::str(
        "[", kOrigin, "] ", p.what, ": no reply from ", describe(p.to),
        " within the timeout (it may be stuck)"))));
  }
  return next;
}

}  // namespace push::dist::detail
