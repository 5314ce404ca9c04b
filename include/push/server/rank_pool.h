#pragma once
// RankPool: machin's process Pool over the ranks of a job. Tasks are functions registered
// by name in every process (PUSH_RPC_FUNCTION / register_function: C++ ships no closures
// between processes); the pool runs them on its worker ranks, at most `per_worker` at once
// on each, with ThreadPool's methods.
//
//   c10::IValue square(const push::dist::RpcArgs& a) { return a[0].toInt() * a[0].toInt(); }
//   PUSH_RPC_FUNCTION(square);
//   ...
//   push::server::RankPool pool(rpc, {"worker1", "worker2"});
//   auto all = pool.map("square", {1, 2, 3});              // [1, 4, 9], in item order
//   auto f = pool.apply_async("square", {c10::IValue(7)});
//
// Calls wait in the pool's queue until a worker has a free slot, so a long map never has
// more than workers x per_worker calls in flight; cancel_queued() fails those not yet sent.
// A failed call (the function threw, the worker died, the call timed out) fails its
// future; map/starmap rethrow the first failure in item order as a TaskError naming the
// item's index, after every call has ended. Calls go only to workers still there: a
// worker that died gets none after its loss is known, and once every worker is lost the
// queued calls fail. close() takes no new calls and join() waits for the queued ones (a
// soft close, as machin's); destruction cancels queued calls and waits for those in flight.
// A worker that dies is not replaced: ranks are started by the job's launcher, not by the
// pool (machin's pool forks its own processes and refills them).
#include <push/dist/rpc.h>
#include <push/parallel/results.h>

#include <torch/arg.h>

#include <memory>
#include <string>
#include <vector>

namespace push::server {

struct RankPoolOptions {
  /// Member names of the group (empty: every member but this process).
  TORCH_ARG(std::vector<std::string>, workers) = {};
  /// Calls in flight per worker (>= 1).
  TORCH_ARG(int, per_worker) = 1;
  /// Each call's timeout (nullopt: the group's).
  TORCH_ARG(std::optional<dist::Milliseconds>, timeout) = std::nullopt;
  /// A registered function every worker runs once with `initargs` before the pool's first
  /// call there (machin's initializer / initargs): per-process state later calls read.
  /// Its failure on any worker fails the constructor, naming the worker.
  TORCH_ARG(std::string, initializer) = "";
  TORCH_ARG(dist::RpcArgs, initargs) = {};
  /// One context per worker, in the order of `workers` (machin's CtxPool worker_contexts):
  /// sent to its worker once, kept there while the pool lives, and handed to every call
  /// the pool runs there as its first argument. Empty: calls get their arguments alone.
  TORCH_ARG(std::vector<c10::IValue>, worker_contexts) = {};
};

class RankPool {
 public:
  RankPool(dist::RpcGroup group, RankPoolOptions options);
  /// `workers`: member names of `group` (empty: every member but this process).
  RankPool(dist::RpcGroup group, std::vector<std::string> workers = {}, int per_worker = 1,
           std::optional<dist::Milliseconds> timeout = std::nullopt);
  ~RankPool();
  RankPool(const RankPool&) = delete;
  RankPool& operator=(const RankPool&) = delete;

  const std::vector<std::string>& workers() const;
  Future<c10::IValue> apply_async(const std::string& function, dist::RpcArgs args = {});
  c10::IValue apply(const std::string& function, dist::RpcArgs args = {});
  /// function(item) for every item.
  std::vector<c10::IValue> map(const std::string& function, const std::vector<c10::IValue>& items);
  /// function(args...) for every argument list.
  std::vector<c10::IValue> starmap(const std::string& function, const std::vector<dist::RpcArgs>& items);
  /// map without waiting: a future of every result in item order, failed (once every call
  /// has ended) with the first TaskError in item order (machin's map_async).
  Future<std::vector<c10::IValue>> map_async(const std::string& function, const std::vector<c10::IValue>& items);
  /// starmap without waiting, as map_async.
  Future<std::vector<c10::IValue>> starmap_async(const std::string& function, const std::vector<dist::RpcArgs>& items);
  parallel::Results<c10::IValue> imap(const std::string& function, const std::vector<c10::IValue>& items);
  parallel::Results<c10::IValue> imap_unordered(const std::string& function, const std::vector<c10::IValue>& items);
  /// Fails the calls not sent yet with push::CancelledError; returns how many.
  size_t cancel_queued();
  /// Calls waiting for a free slot.
  size_t queued() const;
  /// Takes no new calls (they fail with push::Error); the queued ones still run.
  void close();
  /// After close(): waits until every queued and in-flight call has ended.
  void join();

  struct Impl;

 private:
  std::vector<Future<c10::IValue>> each(const std::string& function, std::vector<dist::RpcArgs> items,
                                        const char* origin);
  std::shared_ptr<Impl> impl_;
};

}  // namespace push::server
