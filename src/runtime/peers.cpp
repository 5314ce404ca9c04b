#include "runtime/peers.h"

#include <push/core/errors.h>

#include <unistd.h>

#include <atomic>
#include <iostream>
#include <sstream>

namespace push::detail {
namespace {

constexpr const char* kFunction = "push.particles";

// The distributions of this process that take requests, by name.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::weak_ptr<Peers>>& registry() {
  static std::map<std::string, std::weak_ptr<Peers>> r;
  return r;
}

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown-host";
  return buffer;
}

// An error from another rank, or from the transport, as one line naming `origin`.
Error rethrown_as(const char* origin) {
  try {
    throw;
  } catch (const dist::RemoteError& e) {
    return Error(c10::str("[", origin, "] ", e.remote_message()));
  } catch (...) {
    return Error(c10::str("[", origin, "] ", describe(std::current_exception())));
  }
}

}  // namespace

std::shared_ptr<Peers> Peers::create(const dist::World& world, int lanes) {
  constexpr const char* origin = "push::Push";
  static std::once_flag registered;
  std::call_once(registered, [] {
    dist::register_function(kFunction, [](const dist::RpcArgs& body) -> c10::IValue {
      PeerRequest request = PeerRequest::decode(body);
      std::shared_ptr<Peers> peers;
      {
        std::lock_guard<std::mutex> lock(registry_mutex());
        auto it = registry().find(request.distribution);
        if (it != registry().end()) peers = it->second.lock();
      }
      PUSH_CHECK(peers != nullptr, "push::Push", "distribution '", request.distribution,
                 "' does not exist on this rank (it was destroyed or never built)");
      return peers->dispatch(std::move(request));
    });
  });
  // Every rank builds its distributions in the same order, so the k-th one has the same
  // name everywhere.
  static std::atomic<int64_t> counter{0};
  auto peers = std::shared_ptr<Peers>(new Peers());
  Peers& p = *peers;
  p.world_ = world;
  p.name_ = c10::str("push/", counter.fetch_add(1));
  p.rank_ = world.rank();
  p.names_ = world.names();

  // Lanes and host of every rank, through the store.
  const dist::Store store = world.store();
  const std::string prefix = c10::str("push-runtime/", p.name_, "/rank");
  const std::string mine = c10::str(lanes, " ", host_name());
  store.set(prefix + std::to_string(p.rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world.size(); ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, world.options().init_timeout());
  } catch (const std::exception& e) {
    std::string missing;
    for (int r = 0; r < world.size(); ++r) {
      try {
        if (!store.check({keys[static_cast<size_t>(r)]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      } catch (const std::exception&) {
      }
    }
    throw Error(c10::str("[", origin, "] ranks ", missing.empty() ? std::string("?") : missing,
                         " did not build distribution '", p.name_, "' within ", world.options().init_timeout().count(),
                         " ms (init_timeout): building a distribution over a World is collective (",
                         std::string(e.what()).substr(0, std::string(e.what()).find('\n')), ")"));
  }
  for (int r = 0; r < world.size(); ++r) {
    const auto bytes = store.get(keys[static_cast<size_t>(r)]);
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    int n = 0;
    std::string host;
    in >> n >> host;
    PUSH_CHECK(n >= 1, origin, "rank ", r, " announced ", n, " lanes");
    p.lanes_.push_back(n);
    p.total_lanes_ += n;
    if (r != p.rank_ && host == host_name()) ++p.ranks_on_host_;
  }

  // Registered before the group exists: another rank may send its first request as soon
  // as the group is formed on its side (requests then wait in dispatch for start()).
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[p.name_] = peers;
  }
  p.group_ = world.rpc_group(p.name_, world.names(), dist::RpcGroupOptions().handler_threads(2));
  std::weak_ptr<Peers> weak = peers;
  p.group_.on_member_lost([weak](int rank, const std::string& why) {
    if (auto self = weak.lock()) self->on_lost(rank, why);
  });
  return peers;
}

Peers::~Peers() {
  leave();
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(name_);
  if (it != registry().end() && it->second.expired()) registry().erase(it);
}

void Peers::start(Serve serve) {
  serve_ = std::move(serve);
  started_.set_value(true);
  all_gather(c10::IValue(), "building the distribution", "push::Push");
  met_ = true;
}

void Peers::leave() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (left_) return;
    left_ = true;
  }
  if (met_) {
    try {
      all_gather(c10::IValue(), "~Push", "push::Push::~Push");
    } catch (const std::exception& e) {
      // A rank was lost: the others learn it the same way; leave without it.
    }
  } else if (!started_future_.is_ready()) {
    // Never started (construction failed half-way): requests waiting to start fail.
    started_.set_error(std::make_exception_ptr(
        CancelledError(c10::str("[push::Push] distribution '", name_, "' was not built on ", describe(rank_)))));
  }
  try {
    group_.shutdown();
  } catch (const std::exception& e) {
    std::cerr << "[push::Push] leaving distribution '" << name_ << "': " << e.what() << "\n";
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(name_);
  }
}

std::pair<int, int> Peers::global_lane(int64_t g) const {
  g %= total_lanes_;
  for (int r = 0; r < size(); ++r) {
    if (g < lanes_of(r)) return {r, static_cast<int>(g)};
    g -= lanes_of(r);
  }
  return {0, 0};  // unreachable: g < total_lanes_
}

std::string Peers::describe(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(names_.size())) return c10::str("rank ", rank);
  return c10::str("rank ", rank, " (", names_[static_cast<size_t>(rank)], ")");
}

std::optional<std::string> Peers::lost(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lost_.find(rank);
  if (it == lost_.end()) return std::nullopt;
  return it->second;
}

Future<c10::IValue> Peers::call(int rank, PeerRequest request) const {
  request.distribution = name_;
  return group_.rpc_async(rank, kFunction, std::move(request).encode(), dist::Milliseconds::max());
}

c10::IValue Peers::dispatch(PeerRequest request) {
  started_future_.wait();  // the first requests may come before this rank finished building
  if (request.op == PeerOp::gather) {
    return collect(request.round, request.from, request.call, std::move(request.value));
  }
  return serve_(std::move(request));
}

std::vector<c10::IValue> Peers::all_gather(c10::IValue value, const std::string& what, const char* origin) {
  int64_t round;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = next_round_++;
  }
  try {
    c10::IValue all;
    if (rank_ == 0) {
      all = collect(round, 0, what, std::move(value));
    } else {
      PeerRequest request;
      request.op = PeerOp::gather;
      request.round = round;
      request.from = rank_;
      request.call = what;
      request.value = std::move(value);
      all = call(0, std::move(request)).wait();
    }
    return all.toListRef().vec();
  } catch (...) {
    throw rethrown_as(origin);
  }
}

c10::IValue Peers::collect(int64_t round, int from, const std::string& what, c10::IValue value) {
  PUSH_CHECK(rank_ == 0, kFunction, "collectives are collected by rank 0, not ", describe(rank_));
  PUSH_CHECK(from >= 0 && from < size(), kFunction, "a collective from unknown rank ", from);
  Future<std::vector<c10::IValue>> done;
  std::optional<Promise<std::vector<c10::IValue>>> complete, mismatched;
  std::vector<c10::IValue> all;
  std::string mismatch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!out_of_step_.empty()) throw Error(out_of_step_);
    Round& r = rounds_[round];
    if (r.values.empty()) {
      r.values.resize(static_cast<size_t>(size()));
      r.call = what;
      r.first = from;
    }
    PUSH_CHECK(!r.values[static_cast<size_t>(from)], kFunction, describe(from), " joined collective ", round, " twice");
    if (r.call != what) {
      // The ranks are out of step (one skipped or reordered a collective, or their
      // distributions differ): nothing they exchange from here on pairs up.
      out_of_step_ = c10::str("the ranks' collective calls do not match: ", describe(r.first), " called ", r.call,
                              " where ", describe(from), " called ", what,
                              " (every rank must make the same collective calls in the same order)");
      mismatch = out_of_step_;
      mismatched.emplace(std::move(r.done));
      rounds_.erase(round);
    } else {
      r.values[static_cast<size_t>(from)] = std::move(value);
      ++r.arrived;
      done = r.done.future();
      if (r.arrived == size()) {
        for (auto& v : r.values) all.push_back(std::move(*v));
        complete.emplace(std::move(r.done));
        rounds_.erase(round);
      }
    }
  }
  if (mismatched) {
    mismatched->set_error(std::make_exception_ptr(Error(mismatch)));
    // Every round still open fails too: its other members are as out of step.
    fail_all_rounds(mismatch);
    throw Error(mismatch);
  }
  if (complete) {
    complete->set_value(std::move(all));
  } else {
    std::map<int, std::string> lost;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lost = lost_;
    }
    for (const auto& [rank, why] : lost) fail_rounds_missing(rank, why);
  }
  c10::impl::GenericList out(c10::AnyType::get());
  for (auto& v : done.wait()) out.push_back(std::move(v));
  return out;
}

void Peers::fail_all_rounds(const std::string& why) {
  std::vector<Promise<std::vector<c10::IValue>>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [round, r] : rounds_) failed.push_back(std::move(r.done));
    rounds_.clear();
  }
  for (auto& p : failed) p.set_error(std::make_exception_ptr(Error(why)));
}

void Peers::on_lost(int rank, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_.emplace(rank, why);
  }
  if (rank_ == 0) fail_rounds_missing(rank, why);
}

void Peers::fail_rounds_missing(int rank, const std::string& why) {
  std::vector<Promise<std::vector<c10::IValue>>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = rounds_.begin(); it != rounds_.end();) {
      if (!it->second.values[static_cast<size_t>(rank)]) {
        failed.push_back(std::move(it->second.done));
        it = rounds_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : failed) {
    p.set_error(
        std::make_exception_ptr(Error(c10::str(describe(rank), " left the job before every rank met (", why, ")"))));
  }
}

}  // namespace push::detail
