// RpcGroup's public API. The data plane is the transport in transport.h (one frame per
// message over TCP connections that stay open); requests run in rpc_serve.cpp, calls and
// replies in rpc_calls.cpp. The job's TCPStore is the control plane: which member holds a
// service or a paired value (key_holders.h), barriers, and each member's address at creation.
#include "dist/rpc/functions.h"
#include "dist/rpc/rpc_state.h"
#include "dist/rpc/rpc_test_access.h"
#include "dist/world_access.h"

#include <algorithm>

namespace push::dist {

void register_function(const std::string& name, RpcFunction fn) {
  PUSH_CHECK(fn, "push::dist::register_function", "function '", name, "' is empty");
  detail::add_function(name, std::move(fn));
}

bool is_function_registered(const std::string& name) { return static_cast<bool>(detail::find_function(name)); }

int detail::RpcTestAccess::port(const RpcGroup& group) { return group.check("port").port(); }
detail::handshake::Bytes detail::RpcTestAccess::key(const RpcGroup& group) { return group.check("key").key(); }
int detail::RpcTestAccess::group_rank(const RpcGroup& group) { return group.check("group_rank").group_rank(); }
std::chrono::nanoseconds detail::RpcTestAccess::reply_window(const RpcGroup& group, int peer) {
  const auto* trips = group.check("reply_window").round_trips();
  return trips ? trips->window(peer) : std::chrono::nanoseconds::zero();
}

// -- RRef ---------------------------------------------------------------------------------

c10::IValue RRef::to_here(std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RRef::to_here";
  PUSH_CHECK(state_, origin, "this RRef is empty");
  auto& r = *state_;
  auto g = r.group.lock();
  PUSH_CHECK(g && !g->stopping(), origin, "the RPC group of this value is shut down");
  const auto t = timeout.value_or(r.timeout);
  if (r.paired) {
    auto f = g->call(r.owner, detail::wire::kFetchPaired, c10::IValue(r.key), t,
                     c10::str("to_here of the value paired under '", r.key, "'"),
                     detail::Pending::Retry{"paired", r.key, 0, nullptr});
    return f.wait();
  }
  const c10::IValue id = r.id.wait();  // the reaper bounds this by the remote call's timeout
  return g->call(r.owner, detail::wire::kFetchRRef, id, t, "to_here of a remote value").wait();
}

void RRef::wait_confirmed(std::optional<Milliseconds>) const {
  PUSH_CHECK(state_, "push::dist::RRef::wait_confirmed", "this RRef is empty");
  if (!state_->paired) state_->id.wait();
}

int RRef::owner() const {
  PUSH_CHECK(state_, "push::dist::RRef::owner", "this RRef is empty");
  return state_->owner_global;
}

const std::string& RRef::owner_name() const {
  PUSH_CHECK(state_, "push::dist::RRef::owner_name", "this RRef is empty");
  return state_->owner_name;
}

namespace detail {

RRefState::~RRefState() {
  if (paired || !id.valid()) return;
  // The last handle is gone: tell the owner once it has the value's id.
  auto release = [group = group, owner = owner, id = id] {
    auto g = group.lock();
    if (!g || g->stopping() || id.has_error()) return;
    g->release_remote(owner, id.wait());
  };
  id.on_complete(std::move(release));
}

}  // namespace detail

// -- RpcGroup -----------------------------------------------------------------------------

detail::RpcState& RpcGroup::check(const char* origin) const {
  PUSH_CHECK(state_, "push::dist::RpcGroup::", origin, " this group is empty (default-constructed)");
  return *state_;
}

const std::string& RpcGroup::name() const { return check("name").name(); }

std::vector<std::string> RpcGroup::members() const {
  auto& s = check("members");
  std::vector<std::string> names;
  for (int r : s.members()) names.push_back(s.world().names().at(r));
  std::sort(names.begin(), names.end());
  return names;
}

bool RpcGroup::is_member(const std::string& name) const {
  auto names = members();
  return std::find(names.begin(), names.end(), name) != names.end();
}

void ServiceSet::add(const std::string& key, RpcFunction handler) {
  group_.register_service(key, std::move(handler));
  keys_.push_back(key);
}

ServiceSet::~ServiceSet() {
  for (const auto& key : keys_) {
    try {
      group_.deregister(key);
    } catch (const std::exception&) {
      // The group is shut down: its services went with it.
    }
  }
}

std::string RpcGroup::self() const { return check("self").world().name(); }

int RpcGroup::rank_of(const Target& member) const {
  auto& s = check("rank_of");
  int global = -1;
  if (std::holds_alternative<int>(member.value())) {
    global = std::get<int>(member.value());
  } else {
    const auto& who = std::get<std::string>(member.value());
    auto& names = s.world().names();
    auto it = std::find(names.begin(), names.end(), who);
    PUSH_CHECK(it != names.end(), "push::dist::RpcGroup", "no worker is named '", who, "' (members of group '",
               s.name(), "': ", s.member_list(), ")");
    global = static_cast<int>(it - names.begin());
  }
  s.group_rank_of_global(global, "push::dist::RpcGroup");
  return global;
}

namespace {

c10::IValue call_body(const std::string& target, RpcArgs args) {
  return c10::ivalue::Tuple::create({c10::IValue(target), c10::ivalue::Tuple::create(std::move(args))});
}

/// Claims `key` for this rank in the store; throws naming the holder when taken.
void claim(detail::RpcState& s, const char* kind, const std::string& key, const char* origin) {
  const int holder = s.holders().claim(kind, key);
  if (holder >= 0) {
    throw Error(c10::str("[", origin, "] '", key, "' is already ",
                         std::string(kind) == "service" ? "registered" : "paired", " in group '", s.name(), "' by ",
                         s.world().names().at(holder), " (rank ", holder, ")"));
  }
}

}  // namespace

void RpcGroup::register_service(const std::string& key, RpcFunction handler) const {
  constexpr const char* origin = "push::dist::RpcGroup::register_service";
  auto& s = check("register_service");
  PUSH_CHECK(handler, origin, "the handler of '", key, "' is empty");
  PUSH_CHECK(s.served().add_service(key, std::move(handler)), origin, "'", key, "' is already registered in group '",
             s.name(), "' by this process (", s.world().name(), ")");
  try {
    claim(s, "service", key, origin);
  } catch (...) {
    RpcFunction gone = s.served().remove_service(key);  // destroyed outside the lock, as in deregister
    throw;
  }
}

void RpcGroup::deregister(const std::string& key) const {
  auto& s = check("deregister");
  // The handler is destroyed outside the table's lock: what it captured may deregister
  // services of its own as it goes (a server owning another server's host).
  RpcFunction gone = s.served().remove_service(key);
  PUSH_CHECK(gone, "push::dist::RpcGroup::deregister", "'", key, "' is not registered in group '", s.name(),
             "' by this process (", s.world().name(), ")");
  s.holders().release("service", key);
}

bool RpcGroup::is_registered(const std::string& key) const {
  return check("is_registered").holders().lookup("service", key, /*fresh=*/true) >= 0;
}

namespace {

int service_owner(detail::RpcState& s, const std::string& key, const char* origin) {
  const int owner = s.holders().lookup("service", key, /*fresh=*/false);
  PUSH_CHECK(owner >= 0, origin, "no service '", key, "' is registered in group '", s.name(), "'");
  return s.group_rank_of_global(owner, origin);
}

}  // namespace

Future<c10::IValue> RpcGroup::registered_async(const std::string& key, RpcArgs args,
                                               std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RpcGroup::registered_async";
  auto& s = check("registered_async");
  const int owner = service_owner(s, key, origin);
  return s.call(owner, detail::wire::kService, call_body(key, std::move(args)), timeout.value_or(s.timeout()),
                c10::str("service '", key, "'"), detail::Pending::Retry{"service", key, 0, nullptr});
}

c10::IValue RpcGroup::registered_sync(const std::string& key, RpcArgs args, std::optional<Milliseconds> timeout) const {
  return registered_async(key, std::move(args), timeout).wait();
}

namespace {

std::shared_ptr<detail::RRefState> make_remote(detail::RpcState& s, const std::shared_ptr<detail::RpcState>& self,
                                               int owner, uint16_t kind, const std::string& target, RpcArgs args,
                                               Milliseconds timeout, std::string what,
                                               std::optional<detail::Pending::Retry> retry = std::nullopt) {
  auto r = std::make_shared<detail::RRefState>();
  r->group = self;
  r->owner = owner;
  r->owner_global = s.members()[owner];
  r->owner_name = s.member_name(owner);
  r->timeout = timeout;
  r->id = s.call(owner, kind, call_body(target, std::move(args)), timeout, std::move(what), std::move(retry));
  return r;
}

}  // namespace

RRef RpcGroup::registered_remote(const std::string& key, RpcArgs args, std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RpcGroup::registered_remote";
  auto& s = check("registered_remote");
  const int owner = service_owner(s, key, origin);
  return RRef(make_remote(s, state_, owner, detail::wire::kRemoteService, key, std::move(args),
                          timeout.value_or(s.timeout()), c10::str("remote service '", key, "'"),
                          detail::Pending::Retry{"service", key, 0, nullptr}));
}

void RpcGroup::pair(const std::string& key, c10::IValue value) const {
  constexpr const char* origin = "push::dist::RpcGroup::pair";
  auto& s = check("pair");
  PUSH_CHECK(s.served().add_paired(key, std::move(value)), origin, "'", key, "' is already paired in group '", s.name(),
             "' by this process (", s.world().name(), ")");
  try {
    claim(s, "paired", key, origin);
  } catch (...) {
    s.served().remove_paired(key);
    throw;
  }
}

void RpcGroup::unpair(const std::string& key) const {
  auto& s = check("unpair");
  PUSH_CHECK(s.served().remove_paired(key), "push::dist::RpcGroup::unpair", "'", key, "' is not paired in group '",
             s.name(), "' by this process (", s.world().name(), ")");
  s.holders().release("paired", key);
}

bool RpcGroup::is_paired(const std::string& key) const {
  return check("is_paired").holders().lookup("paired", key, /*fresh=*/true) >= 0;
}

RRef RpcGroup::get_paired(const std::string& key) const {
  constexpr const char* origin = "push::dist::RpcGroup::get_paired";
  auto& s = check("get_paired");
  const int owner = s.holders().lookup("paired", key, /*fresh=*/false);
  PUSH_CHECK(owner >= 0, origin, "no value is paired under '", key, "' in group '", s.name(), "'");
  auto r = std::make_shared<detail::RRefState>();
  r->group = state_;
  r->owner = s.group_rank_of_global(owner, origin);
  r->owner_global = owner;
  r->owner_name = s.world().names().at(owner);
  r->timeout = s.timeout();
  r->paired = true;
  r->key = key;
  return RRef(r);
}

Future<c10::IValue> RpcGroup::rpc_async(const Target& to, const std::string& function, RpcArgs args,
                                        std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RpcGroup::rpc_async";
  auto& s = check("rpc_async");
  PUSH_CHECK(is_function_registered(function), origin, "no function named '", function,
             "' is registered (PUSH_RPC_FUNCTION or register_function, in every process)");
  const int target = s.group_rank_of_global(rank_of(to), origin);
  return s.call(target, detail::wire::kCall, call_body(function, std::move(args)), timeout.value_or(s.timeout()),
                c10::str("call of '", function, "' on ", s.member_name(target)));
}

c10::IValue RpcGroup::rpc_sync(const Target& to, const std::string& function, RpcArgs args,
                               std::optional<Milliseconds> timeout) const {
  return rpc_async(to, function, std::move(args), timeout).wait();
}

RRef RpcGroup::remote(const Target& to, const std::string& function, RpcArgs args,
                      std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RpcGroup::remote";
  auto& s = check("remote");
  PUSH_CHECK(is_function_registered(function), origin, "no function named '", function,
             "' is registered (PUSH_RPC_FUNCTION or register_function, in every process)");
  const int target = s.group_rank_of_global(rank_of(to), origin);
  return RRef(make_remote(s, state_, target, detail::wire::kRemoteCall, function, std::move(args),
                          timeout.value_or(s.timeout()),
                          c10::str("remote call of '", function, "' on ", s.member_name(target))));
}

void RpcGroup::barrier(std::optional<Milliseconds> timeout) const {
  auto& s = check("barrier");
  s.barrier(timeout.value_or(s.world().options().timeout()));
}

size_t RpcGroup::owned_count() const { return check("owned_count").served().kept_count(); }

void RpcGroup::shutdown() const { check("shutdown").shutdown(); }

void RpcGroup::on_member_lost(std::function<void(int, const std::string&)> fn) const {
  auto& s = check("on_member_lost");
  PUSH_CHECK(fn, "push::dist::RpcGroup::on_member_lost", "the callback is empty");
  const auto before = s.lost().listen(fn);
  for (const auto& [peer, why] : before) fn(s.members().at(static_cast<size_t>(peer)), why);
}

std::vector<int> RpcGroup::lost_members() const {
  auto& s = check("lost_members");
  std::vector<int> out;
  for (int peer : s.lost().members()) out.push_back(s.members().at(static_cast<size_t>(peer)));
  return out;
}

// -- World's factory ----------------------------------------------------------------------

RpcGroup World::rpc_group(const std::string& name, std::vector<std::string> members) const {
  return rpc_group(name, std::move(members), RpcGroupOptions());
}

RpcGroup World::rpc_group(const std::string& name, std::vector<std::string> members,
                          const RpcGroupOptions& options) const {
  constexpr const char* origin = "push::dist::World::rpc_group";
  PUSH_CHECK(!name.empty(), origin, "an RPC group needs a name");
  PUSH_CHECK(options.handler_threads() >= 1, origin, "handler_threads must be >= 1, got ", options.handler_threads());
  std::vector<int> ranks;
  for (const auto& m : members) ranks.push_back(rank_of(m));
  std::sort(ranks.begin(), ranks.end());
  PUSH_CHECK(!ranks.empty(), origin, "group '", name, "' has no members");
  PUSH_CHECK(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(), origin, "group '", name,
             "' lists a member twice: ", c10::Join(", ", members));
  PUSH_CHECK(std::binary_search(ranks.begin(), ranks.end(), rank()), origin, this->name(),
             " is not a member of group '", name, "' (", c10::Join(", ", members),
             "): only members create an RPC group");
  const Milliseconds timeout = options.timeout().value_or(state_->options.rpc_timeout());
  PUSH_CHECK(timeout.count() > 0, origin, "timeout must be positive");
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    prefix = c10::str("push/rpc/", name, "#", state_->group_counts["rpc:" + name]++, "/");
  }
  PUSH_CHECK(options.max_message_bytes() > 0, origin, "max_message_bytes must be positive");
  PUSH_CHECK(!options.handshake_timeout() || options.handshake_timeout()->count() > 0, origin,
             "handshake_timeout must be positive");
  PUSH_CHECK(options.heartbeat_timeout().count() >= 0, origin, "heartbeat_timeout must be >= 0 (0: no heartbeats)");
  PUSH_CHECK(options.reply_spin().count() >= 0 && options.reply_spin() <= std::chrono::seconds(1), origin,
             "reply_spin must be between 0 (sleep at once) and 1 s, got ", options.reply_spin().count(), " us");
  auto barrier =
      std::make_unique<detail::StoreBarrier>(state_->new_client(), prefix + "barrier/", static_cast<int>(ranks.size()),
                                             state_->options.master_addr(), state_->options.master_port());
  auto s = std::make_shared<detail::RpcState>(*this, name, std::move(ranks), timeout, prefix, state_->store,
                                              std::move(barrier));
  // Every member listens, publishes its address and dials the others; all within
  // init_timeout, or the group is not created (the error names who is missing).
  s->connect(state_->options.init_timeout(), state_->new_client(), state_->options, options);
  return RpcGroup(std::move(s));
}

}  // namespace push::dist
