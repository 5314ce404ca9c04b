// RpcGroup's serving side: what a member does with a request, and who runs it.
#include "rpc_state.h"

#include <iostream>

namespace push::dist::detail {

namespace {
constexpr const char* kOrigin = "push::dist::RpcGroup";

struct FunctionTable {
  std::mutex mutex;
  std::map<std::string, RpcFunction> functions;
};

/// Thrown where a request names a service or paired value this member does not hold: the
/// reply says so (wire::kNotHere), and a caller that remembered this member as the holder
/// asks the store again.
class NotHere : public Error {
 public:
  using Error::Error;
};
}  // namespace

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

void add_function(const std::string& name, RpcFunction fn) {
  auto& t = function_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  PUSH_CHECK(t.functions.emplace(name, std::move(fn)).second, "push::dist::register_function",
             "a function named '", name, "' is registered already");
}

void RpcState::on_request(ConnectionPtr from, int peer, const wire::Header& header, c10::IValue value,
                          std::exception_ptr error) {
  enqueue([this, from = std::move(from), peer, header, value = std::move(value), error] {
    Served served;
    if (error) {
      served = Served{false, c10::IValue(push::detail::describe(error)), 0};
    } else {
      served = serve(header.type, value);
    }
    if (header.flags & wire::kNoReply) return;
    wire::Header h;
    h.type = served.ok ? wire::kReplyOk : wire::kReplyError;
    h.flags = served.flags;
    h.id = header.id;
    try {
      wire::Encoded body;
      try {
        body = wire::encode(served.value);
      } catch (const std::exception&) {
        h.type = wire::kReplyError;
        h.flags = 0;
        body = wire::encode(c10::IValue(c10::str("cannot send the result back: ", current_message())));
      }
      transport->reply(from, h, body);
    } catch (const std::exception&) {
      if (!stopping) {
        std::cerr << "[" << kOrigin << "] " << world.name() << ": cannot reply to " << describe(peer)
                  << ": " << current_message() << "\n";
      }
    }
  }, peer);
}

Served RpcState::serve(uint16_t type, const c10::IValue& body) {
  try {
    PUSH_CHECK(wire::is_request(type), kOrigin, "malformed request: unknown message type ", type);
    c10::IValue result;
    uint16_t flags = 0;
    if (type == wire::kCall || type == wire::kService || type == wire::kRemoteCall ||
        type == wire::kRemoteService) {
      PUSH_CHECK(body.isTuple() && body.toTupleRef().elements().size() == 2 &&
                     body.toTupleRef().elements()[0].isString() &&
                     body.toTupleRef().elements()[1].isTuple(),
                 kOrigin, "malformed request: expected (name, (args...)), got ", body.tagKind());
      const auto& elements = body.toTupleRef().elements();
      const std::string target = elements[0].toStringRef();
      const auto& arg_elements = elements[1].toTupleRef().elements();
      RpcArgs args(arg_elements.begin(), arg_elements.end());
      RpcFunction fn;
      if (type == wire::kCall || type == wire::kRemoteCall) {
        fn = find_function(target);
        PUSH_CHECK(fn, kOrigin, "no function named '", target, "' is registered on ", world.name(),
                   " (register it with PUSH_RPC_FUNCTION in every process)");
      } else {
        std::lock_guard<std::mutex> lock(table_mutex);
        auto it = services.find(target);
        if (it == services.end()) {
          throw NotHere(c10::str("[", kOrigin, "] service '", target, "' is not registered on ",
                                 world.name(), " in group '", name, "'"));
        }
        fn = it->second;
      }
      result = fn(args);
      if (type == wire::kRemoteCall || type == wire::kRemoteService) {
        std::lock_guard<std::mutex> lock(table_mutex);
        const int64_t id = next_owned++;
        owned.emplace(id, std::move(result));
        result = c10::IValue(id);
        flags = wire::kOwnedValue;
      }
    } else if (type == wire::kFetchRRef || type == wire::kReleaseRRef) {
      PUSH_CHECK(body.isInt(), kOrigin, "malformed request: expected a value id, got ", body.tagKind());
      std::lock_guard<std::mutex> lock(table_mutex);
      auto it = owned.find(body.toInt());
      PUSH_CHECK(it != owned.end(), kOrigin, "no value with id ", body.toInt(), " on ", world.name(),
                 " (released, or never created)");
      if (type == wire::kFetchRRef) result = it->second;
      else owned.erase(it);
    } else {
      PUSH_CHECK(body.isString(), kOrigin, "malformed request: expected a key, got ", body.tagKind());
      std::lock_guard<std::mutex> lock(table_mutex);
      auto it = paired.find(body.toStringRef());
      if (it == paired.end()) {
        throw NotHere(c10::str("[", kOrigin, "] no value is paired under '", body.toStringRef(),
                               "' on ", world.name(), " in group '", name, "'"));
      }
      result = it->second;
    }
    return Served{true, std::move(result), flags};
  } catch (const NotHere&) {
    return Served{false, c10::IValue(current_message()), wire::kNotHere};
  } catch (const std::exception&) {
    return Served{false, c10::IValue(current_message()), 0};
  }
}

void RpcState::enqueue(std::function<void()> job, int peer) {
  // A peer's requests go to one loop (its thread stays warm, its calls start in order);
  // other jobs are dealt round robin.
  const uint64_t slot = peer >= 0 ? static_cast<uint64_t>(peer) : next_loop.fetch_add(1, std::memory_order_relaxed);
  auto& loop = loops[slot % loops.size()];
  loop->post_fiber(std::move(job), [this](std::exception_ptr error) {
    if (stopping) return;  // cancelled by shutdown: its caller's call fails there
    std::cerr << "[" << kOrigin << "] " << world.name() << ": " << push::detail::describe(error) << "\n";
  });
}

void RpcState::check_not_own_handler(const char* what) const {
  for (const auto& loop : loops) {
    PUSH_CHECK(EventLoop::current() != loop.get(), kOrigin, "group '", name, "' cannot ", what,
               " from one of its own handlers (they run on its event loops)");
  }
}

void RpcState::stop_loops() {
  for (auto& loop : loops) loop->stop();
}

RRefState::~RRefState() {
  if (paired || !id.valid()) return;
  // The last handle is gone: tell the owner once it has the value's id (from a handler
  // fiber, never from the transport's reader, which must not block on a send).
  auto release = [group = group, owner = owner, id = id] {
    auto g = group.lock();
    if (!g || g->stopping || id.has_error()) return;
    const c10::IValue value = id.wait();
    g->enqueue([g = g.get(), owner, value] { g->notify(owner, wire::kReleaseRRef, value); });
  };
  id.on_complete(std::move(release));
}

}  // namespace push::dist::detail
