#pragma once
// RpcGroup: named services, paired values and direct calls between the members of a group.
//
//   // In every process (same binary): a function callable by name.
//   c10::IValue add(const push::dist::RpcArgs& a) { return a[0].toTensor() + a[1].toTensor(); }
//   PUSH_RPC_FUNCTION(add);
//
//   auto rpc = world.rpc_group("trainers", {"worker0", "worker1"});   // members only
//   auto y = rpc.rpc_sync("worker1", "add", {torch::ones(2), torch::ones(2)});
//   push::Future<c10::IValue> f = rpc.rpc_async(1, "add", {x, x});   // by global rank
//   push::dist::RRef r = rpc.remote("worker1", "add", {x, x});        // value stays on worker1
//   r.to_here();
//
//   if (world.rank() == 0) rpc.register_service("count", [](const RpcArgs&) { ... });
//   rpc.barrier();
//   rpc.registered_sync("count", {});            // runs on whoever registered "count"
//   rpc.pair("weights", w);  rpc.get_paired("weights").to_here();
//
// Arguments and results are c10::IValues: None, bools, ints, doubles, complex numbers,
// strings, tensors, and tuples, lists and dicts of them. Tensors travel out of band (their
// bytes are never pickled) and arrive as dense CPU tensors; each view arrives as a tensor
// of its own. An exception in the callee comes back as push::dist::RemoteError (rank and
// message). Every call has a timeout (RpcGroupOptions::timeout, or per call;
// Milliseconds::max() waits for the reply or the member's loss, however long); a call to a
// member whose connection closes (it died or left) fails at once, naming it. All members
// are thread-safe. Handlers run as fibers on the group's event loops: a handler may call
// other members, itself, or back into its caller, to any depth, and a wait inside it
// suspends the handler, not the thread (a handler that blocks its thread otherwise, with a
// sleep or blocking I/O, holds up the other calls of its loop). The group leaves with
// shutdown() (a barrier of all members, then the threads stop; not from its own handlers);
// the destructor does it if you did not. docs/distributed.md describes the transport.
#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <push/core/future.h>
#include <push/dist/world.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace push::dist {

using RpcArgs = std::vector<c10::IValue>;
/// A callable service or function: arguments in, one value out (None for "nothing").
using RpcFunction = std::function<c10::IValue(const RpcArgs&)>;

/// An exception raised by the callee, carried back to the caller.
class RemoteError : public Error {
 public:
  RemoteError(int rank, std::string name, std::string message, const std::string& what)
      : Error(what), rank_(rank), name_(std::move(name)), message_(std::move(message)) {}
  int rank() const { return rank_; }
  const std::string& worker() const { return name_; }
  const std::string& remote_message() const { return message_; }

 private:
  int rank_;
  std::string name_;
  std::string message_;
};

/// Registers `fn` under `name` in this process (throws push::Error on a duplicate). Do it
/// identically in every process, before calls arrive: a name stands for the function.
void register_function(const std::string& name, RpcFunction fn);
bool is_function_registered(const std::string& name);

struct FunctionRegistrar {
  FunctionRegistrar(const char* name, RpcFunction fn) { register_function(name, std::move(fn)); }
};

/// A worker named by its name ("worker1") or its global rank.
class Target {
 public:
  Target(int rank) : value_(rank) {}                       // NOLINT: implicit on purpose
  Target(std::string name) : value_(std::move(name)) {}    // NOLINT
  Target(const char* name) : value_(std::string(name)) {}  // NOLINT
  const std::variant<int, std::string>& value() const { return value_; }

 private:
  std::variant<int, std::string> value_;
};

struct RpcGroupOptions {
  /// Default timeout of each call; unset: the world's rpc_timeout.
  TORCH_ARG(std::optional<Milliseconds>, timeout) = std::nullopt;
  /// Event loops (one thread each) that run incoming calls, each call as a fiber.
  TORCH_ARG(int, handler_threads) = 4;
  /// Largest message (request or reply, tensors included) sent or accepted; a larger one
  /// fails its call, and a peer announcing one loses its connection.
  TORCH_ARG(uint64_t, max_message_bytes) = uint64_t{4} << 30;
  /// Received tensors of 1 MiB or more land in buffers that are reused once the tensors
  /// are freed (no page faults, no zeroing); at most this many bytes of freed buffers are
  /// kept per group. 0: every received tensor is a fresh allocation.
  TORCH_ARG(std::size_t, receive_pool_bytes) = std::size_t{256} << 20;
  /// Between members on one host (same machine, PID namespace, network namespace and user:
  /// containers with a network of their own are hosts of their own), messages with
  /// 256 KiB or more of tensor data travel through shared memory: each member makes a
  /// ring of `shared_memory_bytes` (1 MiB slots) per connection it sends large messages
  /// on. false: everything goes through the sockets.
  TORCH_ARG(bool, shared_memory) = true;
  TORCH_ARG(std::size_t, shared_memory_bytes) = std::size_t{16} << 20;
  /// How long a new connection may take to prove it belongs to the job (the handshake,
  /// docs/distributed.md); at most 64 connections wait at once, a 65th closes the oldest.
  /// Unset: init_timeout, at most 10 s.
  TORCH_ARG(std::optional<Milliseconds>, handshake_timeout) = std::nullopt;
  /// A member that sends nothing for this long, not even the heartbeat each member sends
  /// its peers every quarter of it, is lost: stopped (SIGSTOP), hung or cut off. Calls
  /// pending on it fail and on_member_lost's callbacks run, as for a member that died.
  /// 0: never (only a closed connection or a call's timeout tell).
  TORCH_ARG(Milliseconds, heartbeat_timeout) = std::chrono::seconds(30);
  /// A thread (or a fiber whose loop has nothing else to run) waiting for a call's reply
  /// checks for it without sleeping for up to twice the recent round trip to that member,
  /// at most this long, before it sleeps: waking a sleeping thread costs about as much as a
  /// small call over loopback. Members whose calls take longer get no such wait. The
  /// checks use the waiting thread's CPU; 0 turns them off.
  TORCH_ARG(std::chrono::microseconds, reply_spin) = std::chrono::microseconds(200);
};

namespace detail {
class RpcState;
struct RRefState;
class RpcTestAccess;  // src/dist: what the wire protocol's tests reach
}  // namespace detail

/// A value owned by one member (the result of remote(), or a paired value). Copies share
/// one reference; the owner drops a remote() result when the last copy is gone. A paired
/// value lives until it is unpaired.
class RRef {
 public:
  RRef() = default;
  /// Fetches the value (a copy) from its owner.
  c10::IValue to_here(std::optional<Milliseconds> timeout = std::nullopt) const;
  /// Global rank of the owner.
  int owner() const;
  const std::string& owner_name() const;
  /// Waits until the owner holds the value (or rethrows why it never will).
  void wait_confirmed(std::optional<Milliseconds> timeout = std::nullopt) const;

 private:
  friend class RpcGroup;
  explicit RRef(std::shared_ptr<detail::RRefState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::RRefState> state_;
};

class RpcGroup {
 public:
  RpcGroup() = default;

  const std::string& name() const;
  /// Member names, ascending.
  std::vector<std::string> members() const;
  bool is_member(const std::string& name) const;
  /// This process's name (its worker name in the World).
  std::string self() const;

  // Services: a handler registered by one member, callable by every member by key.
  void register_service(const std::string& key, RpcFunction handler) const;
  void deregister(const std::string& key) const;
  bool is_registered(const std::string& key) const;
  c10::IValue registered_sync(const std::string& key, RpcArgs args = {},
                              std::optional<Milliseconds> timeout = std::nullopt) const;
  Future<c10::IValue> registered_async(const std::string& key, RpcArgs args = {},
                                       std::optional<Milliseconds> timeout = std::nullopt) const;
  RRef registered_remote(const std::string& key, RpcArgs args = {},
                         std::optional<Milliseconds> timeout = std::nullopt) const;

  // Paired values: a value one member publishes under a key.
  void pair(const std::string& key, c10::IValue value) const;
  void unpair(const std::string& key) const;
  bool is_paired(const std::string& key) const;
  RRef get_paired(const std::string& key) const;

  // Direct calls of a function registered with register_function / PUSH_RPC_FUNCTION.
  c10::IValue rpc_sync(const Target& to, const std::string& function, RpcArgs args = {},
                       std::optional<Milliseconds> timeout = std::nullopt) const;
  Future<c10::IValue> rpc_async(const Target& to, const std::string& function, RpcArgs args = {},
                                std::optional<Milliseconds> timeout = std::nullopt) const;
  RRef remote(const Target& to, const std::string& function, RpcArgs args = {},
              std::optional<Milliseconds> timeout = std::nullopt) const;

  /// Blocks until every member calls barrier(); correct under any number of repetitions.
  void barrier(std::optional<Milliseconds> timeout = std::nullopt) const;
  /// Barrier of all members, then stops this process's threads. Idempotent.
  void shutdown() const;

  /// Values this member holds for remote() handles elsewhere (released with their last copy).
  size_t owned_count() const;

  /// Calls `fn(global_rank, why)` when the connection to a member closes before this
  /// group shuts down (the member died, left, or sent bytes that are not frames), and at
  /// once for each member lost before the call. It runs on the group's I/O thread: keep
  /// it short, never wait in it. Shutdown's barrier does not wait for members lost by
  /// then (they could never reach it).
  void on_member_lost(std::function<void(int, const std::string&)> fn) const;
  /// Global ranks of the members lost so far, ascending. A lost member that a later call
  /// dials again and that answers (it was alive: a partition healed, or it dropped a
  /// connection it could not write to) leaves the list; callbacks that ran are not undone.
  std::vector<int> lost_members() const;

  /// Global rank of a member; push::Error for a non-member.
  int rank_of(const Target& member) const;

 private:
  friend class World;
  friend class detail::RpcTestAccess;
  explicit RpcGroup(std::shared_ptr<detail::RpcState> state) : state_(std::move(state)) {}
  detail::RpcState& check(const char* origin) const;
  std::shared_ptr<detail::RpcState> state_;
};

/// Services that one owner registers in a group and takes down together: add() registers
/// one (a push::Error when its key is taken, as register_service); destruction deregisters
/// every one added, quietly (the group may be shut down by then). A constructor that fails
/// half-way thus leaves none of its services behind. Move-only.
class ServiceSet {
 public:
  explicit ServiceSet(RpcGroup group) : group_(std::move(group)) {}
  ~ServiceSet();
  ServiceSet(ServiceSet&& other) noexcept = default;
  ServiceSet& operator=(ServiceSet&&) = delete;
  ServiceSet(const ServiceSet&) = delete;
  ServiceSet& operator=(const ServiceSet&) = delete;
  void add(const std::string& key, RpcFunction handler);

 private:
  RpcGroup group_;
  std::vector<std::string> keys_;
};

}  // namespace push::dist

/// Registers the function `fn` under its own name at program start.
#define PUSH_RPC_FUNCTION(fn) static ::push::dist::FunctionRegistrar push_rpc_function_##fn(#fn, fn)
