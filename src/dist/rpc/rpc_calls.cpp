// RpcGroup's calling side: sending requests, matching replies, deadlines and lost peers.
#include "dist/rpc/rpc_state.h"

#include <iostream>
#include "dist/transport/rpc_origin.h"
#include "dist/world_access.h"

namespace push::dist::detail {

// -- sending -------------------------------------------------------------------------------

Future<c10::IValue> RpcState::call(int to, uint16_t type, const c10::IValue& body, Milliseconds call_timeout,
                                   std::string what, std::optional<Pending::Retry> retry) {
  PUSH_CHECK(!stopping_, kRpcOrigin, what, ": group '", name_, "' is shut down");
  auto encoded = std::make_shared<const wire::Encoded>(wire::encode(body));
  if (retry) {
    retry->type = type;
    retry->body = encoded;
  }
  Pending p;
  auto future = p.promise.future();
  // Milliseconds::max(): wait until the reply or the member's loss (Clock::deadline_after saturates).
  p.deadline = Clock::deadline_after(call_timeout);
  p.to = to;
  p.what = std::move(what);
  p.retry = std::move(retry);
  send_pending(std::move(p), type, encoded);
  return future;
}

void RpcState::send_pending(Pending p, uint16_t type, std::shared_ptr<const wire::Encoded> encoded) {
  const int to = p.to;
  const auto deadline = p.deadline;
  // Set again when a call moves to a key's new holder: its window and round trip are that member's.
  p.sent = std::chrono::steady_clock::now();
  if (to != group_rank_ && round_trips_) p.promise.expect_within(round_trips_->window(to));
  const auto [id, earliest] = calls_.add(std::move(p));
  if (earliest) transport_->wake_by(deadline);
  if (to == group_rank_) {
    // A call to oneself takes the same path minus the wire: a handler fiber runs it on a
    // copy of the arguments and the caller gets a copy of the result, as from any member.
    loops_.enqueue([this, id = id, type, encoded] {
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
      on_reply(group_rank_, h, std::move(served.value), nullptr);
    });
    return;
  }
  try {
    wire::Header h;
    h.type = type;
    h.id = static_cast<uint64_t>(id);
    transport_->send(to, h, *encoded);
  } catch (const std::exception&) {
    const std::string text = current_message();
    if (auto failed = calls_.take(id)) {
      failed->promise.set_error(std::make_exception_ptr(
          Error(c10::str("[", kRpcOrigin, "] ", failed->what, ": cannot send to ", describe(to), ": ", text))));
    }
  }
}

void RpcState::notify(int to, uint16_t type, const c10::IValue& body) {
  if (stopping_) return;
  wire::Header h;
  h.type = type;
  h.flags = wire::kNoReply;
  if (to == group_rank_) {
    loops_.enqueue([this, type, body] { serve(type, body); });
    return;
  }
  try {
    transport_->send(to, h, wire::encode(body));
  } catch (const std::exception&) {
    // The peer is gone, and with it what it held for us.
  }
}

void RpcState::release_remote(int owner, c10::IValue id) {
  loops_.enqueue([this, owner, id = std::move(id)] { notify(owner, wire::kReleaseRRef, id); });
}

// -- replies -------------------------------------------------------------------------------

void RpcState::on_reply(int peer, const wire::Header& header, c10::IValue value, std::exception_ptr error) {
  // A call that is gone timed out; an id of a call to someone else is not this reply's call.
  auto p = calls_.take(static_cast<int64_t>(header.id), peer);
  if (!p) {
    // A late reply. A value the callee keeps for it is released.
    if (!error && header.type == wire::kReplyOk && (header.flags & wire::kOwnedValue) && value.isInt()) {
      release_remote(peer, std::move(value));
    }
    return;
  }
  if (peer != group_rank_ && round_trips_) round_trips_->record(peer, std::chrono::steady_clock::now() - p->sent);
  if (error) {
    p->promise.set_error(
        std::make_exception_ptr(Error(c10::str("[", kRpcOrigin, "] ", p->what, ": malformed reply from ",
                                               describe(peer), ": ", push::detail::describe(error)))));
    return;
  }
  if (header.type == wire::kReplyOk) {
    p->promise.set_value(std::move(value));
    return;
  }
  if ((header.flags & wire::kNotHere) && p->retry) {
    send_to_new_holder(std::make_shared<Pending>(std::move(*p)));
    return;
  }
  const std::string message = value.isString() ? value.toStringRef() : "(unreadable error)";
  p->promise.set_error(std::make_exception_ptr(
      RemoteError(members_[peer], member_name(peer), message,
                  c10::str("[", kRpcOrigin, "] ", p->what, " failed on ", describe(peer), ": ", message))));
}

void RpcState::send_to_new_holder(std::shared_ptr<Pending> moved) {
  // Asks the store who holds the key now (not on the I/O thread: a store round trip), and
  // sends the call there, once.
  loops_.enqueue([this, moved] {
    try {
      auto retry = std::move(*moved->retry);
      moved->retry.reset();
      const bool service = std::string(retry.kind) == "service";
      const int holder = holders_.lookup(retry.kind, retry.key, /*fresh=*/true);
      PUSH_CHECK(holder >= 0, kRpcOrigin, service ? "no service '" : "no value is paired under '", retry.key,
                 service ? "' is registered" : "'", " in group '", name_, "'");
      moved->to = group_rank_of_global(holder, kRpcOrigin);
      send_pending(std::move(*moved), retry.type, retry.body);
    } catch (const std::exception&) {
      moved->promise.set_error(std::current_exception());
    }
  });
}

void RpcState::on_peer_lost(int peer, const std::string& why) {
  const auto listeners = lost_.lose(peer, why);
  // A member that left after shutdown's barrier is not lost to the World.
  if (!leaving_) WorldAccess::state(world_).mark_lost(members_.at(static_cast<size_t>(peer)), true);
  for (auto& p : calls_.take_to(peer)) {
    p.promise.set_error(
        std::make_exception_ptr(Error(c10::str("[", kRpcOrigin, "] ", p.what, ": lost the connection to ",
                                               describe(peer), " (", why, "): it died or left the group"))));
  }
  for (const auto& fn : listeners) {
    try {
      fn(members_.at(static_cast<size_t>(peer)), why);
    } catch (const std::exception& e) {
      std::cerr << "[push::dist::RpcGroup] a member-lost callback threw: " << e.what() << "\n";
    }
  }
}

std::optional<Clock::time_point> RpcState::expire() {
  auto expired = calls_.expire(Clock::now());
  for (auto& p : expired.calls) {
    p.promise.set_error(std::make_exception_ptr(Error(c10::str(
        "[", kRpcOrigin, "] ", p.what, ": no reply from ", describe(p.to), " within the timeout (it may be stuck)"))));
  }
  return expired.next;
}

}  // namespace push::dist::detail
