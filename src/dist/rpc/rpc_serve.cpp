// RpcGroup's serving side: the functions registered by name in this process, and what a
// member does with a request (on one of its handler loops) and its reply.
#include "dist/rpc/functions.h"
#include "dist/rpc/rpc_state.h"

#include <iostream>
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail {

namespace {

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
  PUSH_CHECK(t.functions.emplace(name, std::move(fn)).second, "push::dist::register_function", "a function named '",
             name, "' is registered already");
}

void RpcState::on_request(ConnectionPtr from, int peer, const wire::Header& header, c10::IValue value,
                          std::exception_ptr error) {
  loops_.enqueue(
      [this, from = std::move(from), peer, header, value = std::move(value), error] {
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
          transport_->reply(from, h, body);
        } catch (const std::exception&) {
          if (!stopping_) {
            std::cerr << "[" << kRpcOrigin << "] " << world_.name() << ": cannot reply to " << describe(peer) << ": "
                      << current_message() << "\n";
          }
        }
      },
      peer);
}

Served RpcState::serve(uint16_t type, const c10::IValue& body) {
  try {
    PUSH_CHECK(wire::is_request(type), kRpcOrigin, "malformed request: unknown message type ", type);
    c10::IValue result;
    uint16_t flags = 0;
    if (type == wire::kCall || type == wire::kService || type == wire::kRemoteCall || type == wire::kRemoteService) {
      PUSH_CHECK(body.isTuple() && body.toTupleRef().elements().size() == 2 &&
                     body.toTupleRef().elements()[0].isString() && body.toTupleRef().elements()[1].isTuple(),
                 kRpcOrigin, "malformed request: expected (name, (args...)), got ", body.tagKind());
      const auto& elements = body.toTupleRef().elements();
      const std::string target = elements[0].toStringRef();
      const auto& arg_elements = elements[1].toTupleRef().elements();
      RpcArgs args(arg_elements.begin(), arg_elements.end());
      RpcFunction fn;
      if (type == wire::kCall || type == wire::kRemoteCall) {
        fn = find_function(target);
        PUSH_CHECK(fn, kRpcOrigin, "no function named '", target, "' is registered on ", world_.name(),
                   " (register it with PUSH_RPC_FUNCTION in every process)");
      } else {
        fn = served_.service(target);
        if (!fn) {
          throw NotHere(c10::str("[", kRpcOrigin, "] service '", target, "' is not registered on ", world_.name(),
                                 " in group '", name_, "'"));
        }
      }
      result = fn(args);
      if (type == wire::kRemoteCall || type == wire::kRemoteService) {
        result = c10::IValue(served_.keep(std::move(result)));
        flags = wire::kOwnedValue;
      }
    } else if (type == wire::kFetchRRef || type == wire::kReleaseRRef) {
      PUSH_CHECK(body.isInt(), kRpcOrigin, "malformed request: expected a value id, got ", body.tagKind());
      bool found;
      if (type == wire::kFetchRRef) {
        auto kept = served_.kept(body.toInt());
        found = kept.has_value();
        if (found) result = std::move(*kept);
      } else {
        found = served_.release(body.toInt());
      }
      PUSH_CHECK(found, kRpcOrigin, "no value with id ", body.toInt(), " on ", world_.name(),
                 " (released, or never created)");
    } else {
      PUSH_CHECK(body.isString(), kRpcOrigin, "malformed request: expected a key, got ", body.tagKind());
      auto value = served_.paired(body.toStringRef());
      if (!value) {
        throw NotHere(c10::str("[", kRpcOrigin, "] no value is paired under '", body.toStringRef(), "' on ",
                               world_.name(), " in group '", name_, "'"));
      }
      result = std::move(*value);
    }
    return Served{true, std::move(result), flags};
  } catch (const NotHere&) {
    return Served{false, c10::IValue(current_message()), wire::kNotHere};
  } catch (const std::exception&) {
    return Served{false, c10::IValue(current_message()), 0};
  }
}

}  // namespace push::dist::detail
