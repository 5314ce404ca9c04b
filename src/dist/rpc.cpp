// RpcGroup. Data plane: a Gloo process group of the members, each message a tagged
// header tensor [magic, kind, call id, payload bytes] then the pickled payload, received
// by one thread per process with recvAnysource. Control plane: the job's TCPStore
// (which member registered a service or paired a value: compareSet; barriers: add).
#include "c10d.h"

#include <torch/serialize.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <thread>

namespace push::dist {
namespace detail {
namespace {

enum Kind : int64_t {
  kCall = RpcTestAccess::kCall,  // ("function", (args...))
  kService = 2,                  // ("key", (args...))
  kRemoteCall = 3,               // as kCall; the result stays here, the reply is its id
  kRemoteService = 4,            // as kService, likewise
  kFetchRRef = 5,                // id
  kReleaseRRef = 6,              // id
  kFetchPaired = 7,              // "key"
  kReplyOk = 16,                 // the pickled result
  kReplyError = 17,              // the pickled error message
};
constexpr int64_t kMagic = 0x7075736852504331;  // "pushRPC1"
constexpr int kHeaderTag = 0;
constexpr int kPayloadTag = 1;
// The receiving thread blocks in recvAnysource until a message or shutdown (abort), so
// the data plane's own Gloo timeout only bounds rendezvous; calls carry their own.
constexpr Milliseconds kIdleForever = std::chrono::hours(24 * 365);

struct FunctionTable {
  std::mutex mutex;
  std::map<std::string, RpcFunction> functions;
};
FunctionTable& function_table() {
  static FunctionTable table;
  return table;
}
RpcFunction find_function(const std::string& name) {
  auto& t = function_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.functions.find(name);
  return it == t.functions.end() ? RpcFunction() : it->second;
}

struct Pending {
  Promise<c10::IValue> promise;
  std::chrono::steady_clock::time_point deadline;
  int to = -1;  // group rank
  std::string what;
};

/// Waits for a c10d send/recv, turning its failure or timeout into push::Error.
bool wait_work(const c10::intrusive_ptr<c10d::Work>& work, Milliseconds timeout) {
  return work->wait(std::max(timeout, Milliseconds(1)));
}

}  // namespace

struct RpcState {
  explicit RpcState(World w) : world(std::move(w)) {}
  World world;
  std::string name;
  std::vector<int> members;  // global ranks, ascending; a member's group rank is its index
  int group_rank = -1;
  Milliseconds timeout{0};
  std::string prefix;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  std::unique_ptr<StoreBarrier> barrier;

  std::vector<std::unique_ptr<std::mutex>> send_mutex;  // a header and its payload stay together

  std::mutex pending_mutex;
  std::condition_variable pending_cv;  // wakes the reaper
  std::map<int64_t, Pending> pending;
  int64_t next_call = 0;

  std::mutex table_mutex;
  std::map<std::string, RpcFunction> services;
  std::map<std::string, c10::IValue> paired;
  std::map<int64_t, c10::IValue> owned;  // remote() results held for their RRefs
  int64_t next_owned = 0;

  std::mutex queue_mutex;
  std::condition_variable queue_cv;
  std::deque<std::function<void()>> queue;

  std::atomic<bool> stopping{false};
  std::mutex recv_mutex;
  c10::intrusive_ptr<c10d::Work> current_recv;
  std::thread receiver;
  std::thread reaper;
  std::vector<std::thread> handlers;
  std::mutex shutdown_mutex;
  bool started = false;  // false when construction failed half-way: nothing to stop
  bool stopped = false;

  ~RpcState() {
    try {
      shutdown();
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
    }
  }

  std::string member_name(int group_rank_of) const {
    return world.names().at(members.at(group_rank_of));
  }
  int group_rank_of_global(int global, const char* origin) const {
    auto it = std::lower_bound(members.begin(), members.end(), global);
    PUSH_CHECK(it != members.end() && *it == global, origin, "rank ", global,
               " is not a member of RPC group '", name, "' (members: ", member_list(), ")");
    return static_cast<int>(it - members.begin());
  }
  std::string member_list() const {
    std::vector<std::string> names;
    for (int r : members) names.push_back(world.names().at(r));
    return c10::Join(", ", names);
  }

  void start(int handler_threads) {
    started = true;
    receiver = std::thread([this] { receive_loop(); });
    reaper = std::thread([this] { reap_loop(); });
    for (int i = 0; i < handler_threads; ++i) handlers.emplace_back([this] { handler_loop(); });
  }

  void shutdown() {
    std::lock_guard<std::mutex> lock(shutdown_mutex);
    if (stopped) return;
    stopped = true;
    if (!started) return;
    std::exception_ptr error;
    try {
      barrier->arrive_and_wait(timeout, "push::dist::RpcGroup::shutdown");
    } catch (...) {
      error = std::current_exception();
    }
    stopping = true;
    {
      std::lock_guard<std::mutex> l(recv_mutex);
      if (current_recv) current_recv->abort();
    }
    receiver.join();
    // Taking each mutex once after setting `stopping` means no waiter can miss the wakeup.
    { std::lock_guard<std::mutex> l(queue_mutex); }
    queue_cv.notify_all();
    for (auto& t : handlers) t.join();
    { std::lock_guard<std::mutex> l(pending_mutex); }
    pending_cv.notify_all();
    reaper.join();
    std::map<int64_t, Pending> left;
    {
      std::lock_guard<std::mutex> l(pending_mutex);
      left.swap(pending);
    }
    for (auto& [id, p] : left) {
      p.promise.set_error(std::make_exception_ptr(CancelledError(c10::str(
          "[push::dist::RpcGroup] ", p.what, ": group '", name, "' shut down before the reply"))));
    }
    if (error) std::rethrow_exception(error);
  }

  // -- sending -----------------------------------------------------------------------

  void send_message(int to, int64_t kind, int64_t id, const std::vector<char>& payload,
                    Milliseconds send_timeout) {
    std::lock_guard<std::mutex> lock(*send_mutex.at(to));
    auto header = torch::tensor({kMagic, kind, id, static_cast<int64_t>(payload.size())}, torch::kLong);
    std::vector<at::Tensor> h{header};
    wait_work(gloo->send(h, to, kHeaderTag), send_timeout);
    if (payload.empty()) return;
    auto body = torch::from_blob(const_cast<char*>(payload.data()),
                                 {static_cast<int64_t>(payload.size())}, torch::kUInt8);
    std::vector<at::Tensor> p{body};
    wait_work(gloo->send(p, to, kPayloadTag), send_timeout);
  }

  Future<c10::IValue> call_bytes(int to, int64_t kind, std::vector<char> payload,
                                 Milliseconds call_timeout, std::string what) {
    PUSH_CHECK(!stopping, "push::dist::RpcGroup", what, ": group '", name, "' is shut down");
    Promise<c10::IValue> promise;
    auto future = promise.future();
    int64_t id;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      id = next_call++;
      pending.emplace(id, Pending{std::move(promise),
                                  std::chrono::steady_clock::now() + call_timeout, to, what});
    }
    pending_cv.notify_all();
    if (to == group_rank) {
      // A call to oneself takes the same path minus the wire: the handler pool runs it
      // and the reply is unpickled like a remote one (a copy, as from any member).
      enqueue([this, id, kind, payload = std::move(payload)] {
        auto [ok, reply] = handle_request(kind, payload);
        complete(id, ok ? kReplyOk : kReplyError, reply);
      });
    } else {
      try {
        send_message(to, kind, id, payload, call_timeout);
      } catch (const std::exception&) {
        fail(id, std::make_exception_ptr(Error(c10::str(
                     "[push::dist::RpcGroup] ", what, ": cannot send to ", member_name(to),
                     " (rank ", members[to], "): ", current_message()))));
      }
    }
    return future;
  }

  Future<c10::IValue> call(int to, int64_t kind, const c10::IValue& body, Milliseconds call_timeout,
                           std::string what) {
    return call_bytes(to, kind, torch::pickle_save(body), call_timeout, std::move(what));
  }

  // -- replies -------------------------------------------------------------------------

  std::optional<Pending> take(int64_t id) {
    std::lock_guard<std::mutex> lock(pending_mutex);
    auto it = pending.find(id);
    if (it == pending.end()) return std::nullopt;  // timed out already
    Pending p = std::move(it->second);
    pending.erase(it);
    return p;
  }

  void fail(int64_t id, std::exception_ptr error) {
    if (auto p = take(id)) p->promise.set_error(std::move(error));
  }

  void complete(int64_t id, int64_t kind, const std::vector<char>& reply) {
    auto p = take(id);
    if (!p) return;
    const std::string who = c10::str(member_name(p->to), " (rank ", members[p->to], ")");
    try {
      c10::IValue value = torch::pickle_load(reply);
      if (kind == kReplyOk) {
        p->promise.set_value(std::move(value));
      } else {
        const std::string message = value.isString() ? value.toStringRef() : "(unreadable error)";
        p->promise.set_error(std::make_exception_ptr(RemoteError(
            members[p->to], member_name(p->to), message,
            c10::str("[push::dist::RpcGroup] ", p->what, " failed on ", who, ": ", message))));
      }
    } catch (const std::exception&) {
      p->promise.set_error(std::make_exception_ptr(Error(c10::str(
          "[push::dist::RpcGroup] ", p->what, ": malformed reply from ", who, " (", reply.size(),
          " bytes): ", current_message()))));
    }
  }

  // -- serving -------------------------------------------------------------------------

  /// Runs one request; returns (ok, pickled result or pickled error message).
  std::pair<bool, std::vector<char>> handle_request(int64_t kind, const std::vector<char>& payload) {
    constexpr const char* origin = "push::dist::RpcGroup";
    try {
      const bool known = kind == kCall || kind == kService || kind == kRemoteCall ||
                         kind == kRemoteService || kind == kFetchRRef || kind == kReleaseRRef ||
                         kind == kFetchPaired;
      PUSH_CHECK(known, origin, "malformed request: unknown message type tag ", kind);
      c10::IValue body;
      try {
        body = torch::pickle_load(payload);
      } catch (const std::exception&) {
        throw Error(c10::str("[", origin, "] malformed request: cannot unpickle its ",
                             payload.size(), " bytes: ", current_message()));
      }
      c10::IValue result;
      if (kind == kCall || kind == kService || kind == kRemoteCall || kind == kRemoteService) {
        PUSH_CHECK(body.isTuple() && body.toTupleRef().elements().size() == 2 &&
                       body.toTupleRef().elements()[0].isString() &&
                       body.toTupleRef().elements()[1].isTuple(),
                   origin, "malformed request: expected (name, (args...)), got ", body.tagKind());
        const auto& elements = body.toTupleRef().elements();
        const std::string target = elements[0].toStringRef();
        const auto& arg_elements = elements[1].toTupleRef().elements();
        RpcArgs args(arg_elements.begin(), arg_elements.end());
        RpcFunction fn;
        if (kind == kCall || kind == kRemoteCall) {
          fn = find_function(target);
          PUSH_CHECK(fn, origin, "no function named '", target, "' is registered on ",
                     world.name(), " (register it with PUSH_RPC_FUNCTION in every process)");
        } else {
          std::lock_guard<std::mutex> lock(table_mutex);
          auto it = services.find(target);
          PUSH_CHECK(it != services.end(), origin, "service '", target, "' is not registered on ",
                     world.name(), " in group '", name, "'");
          fn = it->second;
        }
        result = fn(args);
        if (kind == kRemoteCall || kind == kRemoteService) {
          std::lock_guard<std::mutex> lock(table_mutex);
          const int64_t id = next_owned++;
          owned.emplace(id, std::move(result));
          result = c10::IValue(id);
        }
      } else if (kind == kFetchRRef || kind == kReleaseRRef) {
        PUSH_CHECK(body.isInt(), origin, "malformed request: expected a value id, got ", body.tagKind());
        std::lock_guard<std::mutex> lock(table_mutex);
        auto it = owned.find(body.toInt());
        PUSH_CHECK(it != owned.end(), origin, "no value with id ", body.toInt(), " on ",
                   world.name(), " (released, or never created)");
        if (kind == kFetchRRef) result = it->second;
        else owned.erase(it);
      } else {
        PUSH_CHECK(body.isString(), origin, "malformed request: expected a key, got ", body.tagKind());
        std::lock_guard<std::mutex> lock(table_mutex);
        auto it = paired.find(body.toStringRef());
        PUSH_CHECK(it != paired.end(), origin, "no value is paired under '", body.toStringRef(),
                   "' on ", world.name(), " in group '", name, "'");
        result = it->second;
      }
      return {true, torch::pickle_save(result)};
    } catch (const std::exception&) {
      return {false, torch::pickle_save(c10::IValue(current_message()))};
    }
  }

  void enqueue(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      queue.push_back(std::move(job));
    }
    queue_cv.notify_one();
  }

  void handler_loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(queue_mutex);
        queue_cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and nothing left to run
        job = std::move(queue.front());
        queue.pop_front();
      }
      try {
        job();
      } catch (const std::exception& e) {
        std::cerr << "[push::dist::RpcGroup] " << world.name() << ": " << e.what() << "\n";
      }
    }
  }

  void receive_loop() {
    int failures = 0;
    while (!stopping) {
      try {
        auto header = torch::zeros({4}, torch::kLong);
        std::vector<at::Tensor> h{header};
        c10::intrusive_ptr<c10d::Work> work;
        {
          std::lock_guard<std::mutex> lock(recv_mutex);
          if (stopping) return;
          work = gloo->recvAnysource(h, kHeaderTag);
          current_recv = work;
        }
        if (!work->wait(kIdleForever) || stopping) return;  // aborted by shutdown
        const int from = work->sourceRank();
        const int64_t* field = header.data_ptr<int64_t>();
        const int64_t kind = field[0] == kMagic ? field[1] : -1;
        const int64_t id = field[2];
        const int64_t size = field[3];
        std::vector<char> payload;
        if (size > 0) {
          auto body = torch::empty({size}, torch::kUInt8);
          std::vector<at::Tensor> p{body};
          {
            std::lock_guard<std::mutex> lock(recv_mutex);
            if (stopping) return;
            work = gloo->recv(p, from, kPayloadTag);
            current_recv = work;
          }
          if (!wait_work(work, timeout) || stopping) return;
          payload.assign(reinterpret_cast<const char*>(body.data_ptr()),
                         reinterpret_cast<const char*>(body.data_ptr()) + size);
        }
        failures = 0;
        if (kind == kReplyOk || kind == kReplyError) {
          complete(id, kind, payload);
        } else {
          enqueue([this, from, kind, id, payload = std::move(payload)] {
            auto [ok, reply] = handle_request(kind, payload);
            try {
              send_message(from, ok ? kReplyOk : kReplyError, id, reply, timeout);
            } catch (const std::exception&) {
              std::cerr << "[push::dist::RpcGroup] " << world.name() << ": cannot reply to "
                        << member_name(from) << ": " << current_message() << "\n";
            }
          });
        }
      } catch (const std::exception&) {
        if (stopping) return;
        // A member vanished or a transfer failed: its callers time out; keep serving the rest.
        if (failures++ == 0) {
          std::cerr << "[push::dist::RpcGroup] " << world.name() << " in group '" << name
                    << "': receive failed: " << current_message() << "\n";
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(failures, 50) * 2));
      }
    }
  }

  void reap_loop() {
    std::unique_lock<std::mutex> lock(pending_mutex);
    while (!stopping) {
      auto now = std::chrono::steady_clock::now();
      auto next = now + std::chrono::seconds(1);
      std::vector<Pending> expired;
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second.deadline <= now) {
          expired.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      if (!expired.empty()) {
        lock.unlock();
        for (auto& p : expired) {
          p.promise.set_error(std::make_exception_ptr(Error(c10::str(
              "[push::dist::RpcGroup] ", p.what, ": no reply from ", member_name(p.to), " (rank ",
              members[p.to], ") within the timeout (it may have died or be stuck)"))));
        }
        lock.lock();
        continue;
      }
      pending_cv.wait_until(lock, next);
    }
  }
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

  ~RRefState() {
    if (paired || !id.valid()) return;
    // The last handle is gone: tell the owner, from the handler pool (never from the
    // receiving thread, which must not block on a send).
    auto release = [group = group, owner = owner, timeout = timeout, id = id] {
      auto g = group.lock();
      if (!g || g->stopping || id.has_error()) return;
      const c10::IValue value = id.wait();
      g->enqueue([g = g.get(), owner, timeout, value] {
        g->call(owner, kReleaseRRef, value, timeout, "release of a remote value");
      });
    };
    id.state()->add_callback(std::move(release));
  }
};

Future<c10::IValue> RpcTestAccess::call_raw(const RpcGroup& group, const Target& to, int64_t kind,
                                            std::vector<char> payload, Milliseconds timeout) {
  auto& s = group.check("call_raw");
  const int target = s.group_rank_of_global(group.rank_of(to), "push::dist::RpcTestAccess");
  return s.call_bytes(target, kind, std::move(payload), timeout, "raw message");
}

}  // namespace detail

void register_function(const std::string& name, RpcFunction fn) {
  PUSH_CHECK(fn, "push::dist::register_function", "function '", name, "' is empty");
  auto& t = detail::function_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  PUSH_CHECK(t.functions.emplace(name, std::move(fn)).second, "push::dist::register_function",
             "a function named '", name, "' is registered already");
}

bool is_function_registered(const std::string& name) {
  return static_cast<bool>(detail::find_function(name));
}

// -- RRef ---------------------------------------------------------------------------------

c10::IValue RRef::to_here(std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RRef::to_here";
  PUSH_CHECK(state_, origin, "this RRef is empty");
  auto& r = *state_;
  auto g = r.group.lock();
  PUSH_CHECK(g && !g->stopping, origin, "the RPC group of this value is shut down");
  const auto t = timeout.value_or(r.timeout);
  if (r.paired) {
    auto f = g->call(r.owner, detail::kFetchPaired, c10::IValue(r.key), t,
                     c10::str("to_here of the value paired under '", r.key, "'"));
    return f.wait();
  }
  const c10::IValue id = r.id.wait();  // the reaper bounds this by the remote call's timeout
  return g->call(r.owner, detail::kFetchRRef, id, t, "to_here of a remote value").wait();
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

// -- RpcGroup -----------------------------------------------------------------------------

detail::RpcState& RpcGroup::check(const char* origin) const {
  PUSH_CHECK(state_, "push::dist::RpcGroup::", origin, " this group is empty (default-constructed)");
  return *state_;
}

const std::string& RpcGroup::name() const { return check("name").name; }

std::vector<std::string> RpcGroup::members() const {
  auto& s = check("members");
  std::vector<std::string> names;
  for (int r : s.members) names.push_back(s.world.names().at(r));
  std::sort(names.begin(), names.end());
  return names;
}

bool RpcGroup::is_member(const std::string& name) const {
  auto names = members();
  return std::find(names.begin(), names.end(), name) != names.end();
}

int RpcGroup::rank_of(const Target& member) const {
  auto& s = check("rank_of");
  int global = -1;
  if (std::holds_alternative<int>(member.value())) {
    global = std::get<int>(member.value());
  } else {
    const auto& who = std::get<std::string>(member.value());
    auto& names = s.world.names();
    auto it = std::find(names.begin(), names.end(), who);
    PUSH_CHECK(it != names.end(), "push::dist::RpcGroup", "no worker is named '", who,
               "' (members of group '", s.name, "': ", s.member_list(), ")");
    global = static_cast<int>(it - names.begin());
  }
  s.group_rank_of_global(global, "push::dist::RpcGroup");
  return global;
}

namespace {

c10::IValue call_body(const std::string& target, RpcArgs args) {
  return c10::ivalue::Tuple::create({c10::IValue(target), c10::ivalue::Tuple::create(std::move(args))});
}

std::string owner_key(const detail::RpcState& s, const char* kind, const std::string& key) {
  return c10::str(s.prefix, kind, "/", key);
}

/// The global rank that holds `key` (a service or a paired value), or -1.
int lookup_owner(detail::RpcState& s, const char* kind, const std::string& key) {
  const auto k = owner_key(s, kind, key);
  if (!s.store->check({k})) return -1;
  const auto value = detail::bytes_to_string(s.store->get(k));
  return value.empty() ? -1 : std::stoi(value);
}

/// Claims `key` for this rank in the store; throws naming the holder when taken.
void claim(detail::RpcState& s, const char* kind, const std::string& key, const char* origin) {
  const auto mine = std::to_string(s.world.rank());
  const auto got = detail::bytes_to_string(
      s.store->compareSet(owner_key(s, kind, key), {}, detail::string_to_bytes(mine)));
  if (got != mine) {
    const int holder = std::stoi(got);
    throw Error(c10::str("[", origin, "] '", key, "' is already ",
                         std::string(kind) == "service" ? "registered" : "paired", " in group '",
                         s.name, "' by ", s.world.names().at(holder), " (rank ", holder, ")"));
  }
}

void release_claim(detail::RpcState& s, const char* kind, const std::string& key) {
  s.store->compareSet(owner_key(s, kind, key), detail::string_to_bytes(std::to_string(s.world.rank())),
                      {});
}

}  // namespace

void RpcGroup::register_service(const std::string& key, RpcFunction handler) const {
  constexpr const char* origin = "push::dist::RpcGroup::register_service";
  auto& s = check("register_service");
  PUSH_CHECK(handler, origin, "the handler of '", key, "' is empty");
  {
    std::lock_guard<std::mutex> lock(s.table_mutex);
    PUSH_CHECK(s.services.emplace(key, std::move(handler)).second, origin, "'", key,
               "' is already registered in group '", s.name, "' by this process (", s.world.name(), ")");
  }
  try {
    claim(s, "service", key, origin);
  } catch (...) {
    std::lock_guard<std::mutex> lock(s.table_mutex);
    s.services.erase(key);
    throw;
  }
}

void RpcGroup::deregister(const std::string& key) const {
  auto& s = check("deregister");
  {
    std::lock_guard<std::mutex> lock(s.table_mutex);
    PUSH_CHECK(s.services.erase(key) == 1, "push::dist::RpcGroup::deregister", "'", key,
               "' is not registered in group '", s.name, "' by this process (", s.world.name(), ")");
  }
  release_claim(s, "service", key);
}

bool RpcGroup::is_registered(const std::string& key) const {
  return lookup_owner(check("is_registered"), "service", key) >= 0;
}

namespace {

int service_owner(detail::RpcState& s, const std::string& key, const char* origin) {
  const int owner = lookup_owner(s, "service", key);
  PUSH_CHECK(owner >= 0, origin, "no service '", key, "' is registered in group '", s.name, "'");
  return s.group_rank_of_global(owner, origin);
}

}  // namespace

Future<c10::IValue> RpcGroup::registered_async(const std::string& key, RpcArgs args,
                                               std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RpcGroup::registered_async";
  auto& s = check("registered_async");
  const int owner = service_owner(s, key, origin);
  return s.call(owner, detail::kService, call_body(key, std::move(args)), timeout.value_or(s.timeout),
                c10::str("service '", key, "'"));
}

c10::IValue RpcGroup::registered_sync(const std::string& key, RpcArgs args,
                                      std::optional<Milliseconds> timeout) const {
  return registered_async(key, std::move(args), timeout).wait();
}

namespace {

std::shared_ptr<detail::RRefState> make_remote(detail::RpcState& s, const std::shared_ptr<detail::RpcState>& self, int owner,
                 int64_t kind, const std::string& target, RpcArgs args, Milliseconds timeout,
                 std::string what) {
  auto r = std::make_shared<detail::RRefState>();
  r->group = self;
  r->owner = owner;
  r->owner_global = s.members[owner];
  r->owner_name = s.member_name(owner);
  r->timeout = timeout;
  r->id = s.call(owner, kind, call_body(target, std::move(args)), timeout, std::move(what));
  return r;
}

}  // namespace

RRef RpcGroup::registered_remote(const std::string& key, RpcArgs args,
                                 std::optional<Milliseconds> timeout) const {
  constexpr const char* origin = "push::dist::RpcGroup::registered_remote";
  auto& s = check("registered_remote");
  const int owner = service_owner(s, key, origin);
  return RRef(make_remote(s, state_, owner, detail::kRemoteService, key, std::move(args),
                          timeout.value_or(s.timeout), c10::str("remote service '", key, "'")));
}

void RpcGroup::pair(const std::string& key, c10::IValue value) const {
  constexpr const char* origin = "push::dist::RpcGroup::pair";
  auto& s = check("pair");
  {
    std::lock_guard<std::mutex> lock(s.table_mutex);
    PUSH_CHECK(s.paired.emplace(key, std::move(value)).second, origin, "'", key,
               "' is already paired in group '", s.name, "' by this process (", s.world.name(), ")");
  }
  try {
    claim(s, "paired", key, origin);
  } catch (...) {
    std::lock_guard<std::mutex> lock(s.table_mutex);
    s.paired.erase(key);
    throw;
  }
}

void RpcGroup::unpair(const std::string& key) const {
  auto& s = check("unpair");
  {
    std::lock_guard<std::mutex> lock(s.table_mutex);
    PUSH_CHECK(s.paired.erase(key) == 1, "push::dist::RpcGroup::unpair", "'", key,
               "' is not paired in group '", s.name, "' by this process (", s.world.name(), ")");
  }
  release_claim(s, "paired", key);
}

bool RpcGroup::is_paired(const std::string& key) const {
  return lookup_owner(check("is_paired"), "paired", key) >= 0;
}

RRef RpcGroup::get_paired(const std::string& key) const {
  constexpr const char* origin = "push::dist::RpcGroup::get_paired";
  auto& s = check("get_paired");
  const int owner = lookup_owner(s, "paired", key);
  PUSH_CHECK(owner >= 0, origin, "no value is paired under '", key, "' in group '", s.name, "'");
  auto r = std::make_shared<detail::RRefState>();
  r->group = state_;
  r->owner = s.group_rank_of_global(owner, origin);
  r->owner_global = owner;
  r->owner_name = s.world.names().at(owner);
  r->timeout = s.timeout;
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
  return s.call(target, detail::kCall, call_body(function, std::move(args)),
                timeout.value_or(s.timeout),
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
  return RRef(make_remote(s, state_, target, detail::kRemoteCall, function, std::move(args),
                          timeout.value_or(s.timeout),
                          c10::str("remote call of '", function, "' on ", s.member_name(target))));
}

void RpcGroup::barrier(std::optional<Milliseconds> timeout) const {
  auto& s = check("barrier");
  s.barrier->arrive_and_wait(timeout.value_or(s.world.options().timeout()),
                             "push::dist::RpcGroup::barrier");
}

size_t RpcGroup::owned_count() const {
  auto& s = check("owned_count");
  std::lock_guard<std::mutex> lock(s.table_mutex);
  return s.owned.size();
}

void RpcGroup::shutdown() const { check("shutdown").shutdown(); }

// -- World's factory ----------------------------------------------------------------------

RpcGroup World::rpc_group(const std::string& name, std::vector<std::string> members) const {
  return rpc_group(name, std::move(members), RpcGroupOptions());
}

RpcGroup World::rpc_group(const std::string& name, std::vector<std::string> members,
                          const RpcGroupOptions& options) const {
  constexpr const char* origin = "push::dist::World::rpc_group";
  PUSH_CHECK(!name.empty(), origin, "an RPC group needs a name");
  PUSH_CHECK(options.handler_threads() >= 1, origin, "handler_threads must be >= 1, got ",
             options.handler_threads());
  auto s = std::make_shared<detail::RpcState>(*this);
  s->name = name;
  for (const auto& m : members) s->members.push_back(rank_of(m));
  std::sort(s->members.begin(), s->members.end());
  PUSH_CHECK(!s->members.empty(), origin, "group '", name, "' has no members");
  PUSH_CHECK(std::adjacent_find(s->members.begin(), s->members.end()) == s->members.end(), origin,
             "group '", name, "' lists a member twice: ", c10::Join(", ", members));
  auto self = std::find(s->members.begin(), s->members.end(), rank());
  PUSH_CHECK(self != s->members.end(), origin, this->name(), " is not a member of group '", name,
             "' (", c10::Join(", ", members), "): only members create an RPC group");
  s->group_rank = static_cast<int>(self - s->members.begin());
  s->timeout = options.timeout().value_or(state_->options.rpc_timeout());
  PUSH_CHECK(s->timeout.count() > 0, origin, "timeout must be positive");
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    s->prefix = c10::str("push/rpc/", name, "#", state_->group_counts["rpc:" + name]++, "/");
  }
  s->store = state_->store;
  try {
    s->gloo = state_->make_gloo(s->prefix + "gloo/", s->members, detail::kIdleForever);
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] ", this->name(), " could not connect RPC group '", name,
                         "' within ", state_->options.init_timeout().count(),
                         " ms: ", detail::current_message()));
  }
  s->barrier = std::make_unique<detail::StoreBarrier>(state_->new_client(), s->prefix + "barrier/",
                                                      static_cast<int>(s->members.size()));
  for (size_t i = 0; i < s->members.size(); ++i) s->send_mutex.push_back(std::make_unique<std::mutex>());
  s->start(options.handler_threads());
  return RpcGroup(std::move(s));
}

}  // namespace push::dist
