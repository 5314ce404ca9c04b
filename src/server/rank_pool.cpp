// The pool of ranks: a queue of calls, a slot count per worker, and one dispatcher thread
// that sends a call whenever a slot frees (completions arrive on the RPC threads and only
// post to the dispatcher).
#include <push/server/rank_pool.h>

#include <push/parallel/thread_pool.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "dist/rpc/functions.h"

namespace push::server {
namespace {
constexpr const char* kRankPool = "push::server::RankPool";

// A worker's side of the pools with contexts (machin's CtxPool): each pool's context, by
// the pool's key, from the pool's construction to its destruction.
constexpr const char* kKeepContext = "push.rank_pool.keep_context";
constexpr const char* kCallWithContext = "push.rank_pool.call_with_context";
constexpr const char* kForgetContext = "push.rank_pool.forget_context";

struct Contexts {
  std::mutex mutex;
  std::map<std::string, c10::IValue> by_pool;
};
Contexts& contexts() {
  static Contexts c;
  return c;
}

// (pool key, context)
c10::IValue keep_context(const dist::RpcArgs& a) {
  std::lock_guard lock(contexts().mutex);
  contexts().by_pool[a.at(0).toStringRef()] = a.at(1);
  return c10::IValue();
}
// (pool key, function, args...): function(context, args...)
c10::IValue call_with_context(const dist::RpcArgs& a) {
  const std::string& pool = a.at(0).toStringRef();
  const std::string& function = a.at(1).toStringRef();
  dist::RpcArgs args;
  {
    std::lock_guard lock(contexts().mutex);
    auto it = contexts().by_pool.find(pool);
    PUSH_CHECK(it != contexts().by_pool.end(), kRankPool, "this worker holds no context of pool '", pool, "'");
    args.push_back(it->second);
  }
  auto fn = dist::detail::find_function(function);
  PUSH_CHECK(fn, kRankPool, "no function named '", function,
             "' is registered here (register it with PUSH_RPC_FUNCTION in every process)");
  args.insert(args.end(), a.begin() + 2, a.end());
  return fn(args);
}
// (pool key)
c10::IValue forget_context(const dist::RpcArgs& a) {
  std::lock_guard lock(contexts().mutex);
  contexts().by_pool.erase(a.at(0).toStringRef());
  return c10::IValue();
}
const dist::FunctionRegistrar kKeep(kKeepContext, keep_context);
const dist::FunctionRegistrar kCall(kCallWithContext, call_with_context);
const dist::FunctionRegistrar kForget(kForgetContext, forget_context);

std::string next_pool_key(const dist::RpcGroup& group) {
  static std::atomic<uint64_t> serial{0};
  return c10::str(group.name(), "/", group.self(), "/", serial.fetch_add(1));
}
}  // namespace

struct RankPool::Impl : std::enable_shared_from_this<RankPool::Impl> {
  struct Call {
    std::string function;
    dist::RpcArgs args;
    Promise<c10::IValue> result;
  };

  dist::RpcGroup group;
  std::vector<std::string> workers;
  std::vector<int> ranks;  // the workers' global ranks
  int per_worker = 1;
  std::optional<dist::Milliseconds> timeout;
  std::string context_key;  // non-empty: each worker holds its context under this key

  std::mutex mutex;
  std::condition_variable idle;
  std::deque<Call> queue;
  std::vector<int> busy;  // calls in flight per worker
  int64_t in_flight = 0;
  bool closed = false;
  std::unique_ptr<parallel::ThreadPool> dispatcher;  // one thread

  void enqueue(Call call) {
    {
      std::lock_guard lock(mutex);
      PUSH_CHECK(!closed, kRankPool, "the pool is closed");
      queue.push_back(std::move(call));
    }
    poke();
  }

  // Sends queued calls while workers have free slots, on the dispatcher thread.
  void poke() {
    auto self = shared_from_this();
    try {
      dispatcher->apply_async([self] { self->dispatch(); });
    } catch (const Error&) {
      // The pool is going: nothing is queued any more.
    }
  }

  void dispatch() {
    for (;;) {
      Call call;
      size_t w = 0;
      const auto lost = group.lost_members();
      std::deque<Call> unsendable;  // every worker is lost: failed outside the lock
      {
        std::lock_guard lock(mutex);
        if (queue.empty()) return;
        // The least busy worker that is still there (a lost one fails calls at once, which
        // would free its slots and drain the whole queue into failures).
        std::optional<size_t> pick;
        bool alive = false;
        for (size_t k = 0; k < workers.size(); ++k) {
          if (std::find(lost.begin(), lost.end(), ranks[k]) != lost.end()) continue;
          alive = true;
          if (busy[k] < per_worker && (!pick || busy[k] < busy[*pick])) pick = k;
        }
        if (!alive) {
          unsendable.swap(queue);
          in_flight += static_cast<int64_t>(unsendable.size());  // join waits until they have failed
        } else {
          if (!pick) return;  // every slot taken: a completion pokes again
          w = *pick;
          call = std::move(queue.front());
          queue.pop_front();
          ++busy[w];
          ++in_flight;
        }
      }
      if (!unsendable.empty()) {
        // Futures run their callbacks as they fail (a map_async's, a user's then): not under
        // the pool's lock, which those may take.
        for (auto& c : unsendable) {
          c.result.set_error(std::make_exception_ptr(
              Error(c10::str("[", kRankPool, "] every worker of the pool is lost; '", c.function, "' was not sent"))));
        }
        std::lock_guard lock(mutex);
        in_flight -= static_cast<int64_t>(unsendable.size());
        idle.notify_all();
        return;
      }
      auto self = shared_from_this();
      auto done = [self, w, result = call.result](std::exception_ptr error, const c10::IValue* value) {
        if (error) {
          result.set_error(error);
        } else {
          result.set_value(*value);
        }
        {
          std::lock_guard lock(self->mutex);
          --self->busy[w];
          --self->in_flight;
          self->idle.notify_all();
        }
        self->poke();
      };
      try {
        if (!context_key.empty()) {
          dist::RpcArgs args{context_key, call.function};
          args.insert(args.end(), call.args.begin(), call.args.end());
          call.args = std::move(args);
          call.function = kCallWithContext;
        }
        auto reply = group.rpc_async(workers[w], call.function, std::move(call.args), timeout);
        reply.on_complete([reply, done] {
          if (auto error = reply.error()) {
            done(error, nullptr);
          } else {
            const c10::IValue value = reply.wait();
            done(nullptr, &value);
          }
        });
      } catch (...) {
        done(std::current_exception(), nullptr);
      }
    }
  }

  // The workers still there drop this pool's contexts; a worker gone or stuck is waited
  // for no longer than a call would be.
  void forget_contexts() {
    if (context_key.empty()) return;
    const auto lost = group.lost_members();
    std::vector<Future<c10::IValue>> forgot;
    for (size_t k = 0; k < workers.size(); ++k) {
      if (std::find(lost.begin(), lost.end(), ranks[k]) != lost.end()) continue;
      try {
        forgot.push_back(group.rpc_async(workers[k], kForgetContext, {context_key}, timeout));
      } catch (...) {
        // the group is shutting down: nothing to tell
      }
    }
    for (auto& f : forgot) f.wait_ready();
  }

  size_t cancel_queued() {
    std::deque<Call> cancelled;
    {
      std::lock_guard lock(mutex);
      cancelled.swap(queue);
      idle.notify_all();
    }
    for (auto& c : cancelled) {
      c.result.set_error(std::make_exception_ptr(CancelledError(
          c10::str("[", kRankPool, "] the call of '", c.function, "' was cancelled before it was sent"))));
    }
    return cancelled.size();
  }
};

RankPool::RankPool(dist::RpcGroup group, std::vector<std::string> workers, int per_worker,
                   std::optional<dist::Milliseconds> timeout)
    : RankPool(std::move(group),
               RankPoolOptions().workers(std::move(workers)).per_worker(per_worker).timeout(timeout)) {}

RankPool::RankPool(dist::RpcGroup group, RankPoolOptions options) : impl_(std::make_shared<Impl>()) {
  auto workers = std::move(options.workers());
  const int per_worker = options.per_worker();
  const auto timeout = options.timeout();
  PUSH_CHECK(per_worker >= 1, kRankPool, "per_worker must be >= 1, got ", per_worker);
  if (workers.empty()) {
    for (const auto& m : group.members()) {
      if (m != group.self()) workers.push_back(m);
    }
  }
  PUSH_CHECK(!workers.empty(), kRankPool, "no worker: group '", group.name(), "' has no other member");
  for (const auto& w : workers) {
    PUSH_CHECK(group.is_member(w), kRankPool, "'", w, "' is not a member of group '", group.name(), "'");
  }
  impl_->group = std::move(group);
  impl_->workers = std::move(workers);
  for (const auto& w : impl_->workers) impl_->ranks.push_back(impl_->group.rank_of(w));
  impl_->per_worker = per_worker;
  impl_->timeout = timeout;
  impl_->busy.assign(impl_->workers.size(), 0);
  // Every worker at once; the constructor fails (nothing was queued yet) when one does.
  auto run_everywhere = [&](const std::string& what, const std::string& function, auto args_of) {
    std::vector<Future<c10::IValue>> ran;
    for (size_t k = 0; k < impl_->workers.size(); ++k) {
      ran.push_back(impl_->group.rpc_async(impl_->workers[k], function, args_of(k), timeout));
    }
    for (auto& r : ran) r.wait_ready();
    for (size_t k = 0; k < ran.size(); ++k) {
      if (auto error = ran[k].error()) {
        throw Error(
            c10::str("[", kRankPool, "] ", what, " failed on ", impl_->workers[k], ": ", detail::describe(error)));
      }
    }
  };
  if (!options.worker_contexts().empty()) {
    PUSH_CHECK(options.worker_contexts().size() == impl_->workers.size(), kRankPool, impl_->workers.size(),
               " workers but ", options.worker_contexts().size(), " worker_contexts");
    impl_->context_key = next_pool_key(impl_->group);
  }
  try {
    if (!impl_->context_key.empty()) {
      run_everywhere("sending the workers' contexts", kKeepContext, [&](size_t k) {
        return dist::RpcArgs{impl_->context_key, options.worker_contexts()[k]};
      });
    }
    if (!options.initializer().empty()) {
      run_everywhere(c10::str("the initializer '", options.initializer(), "'"), options.initializer(),
                     [&](size_t) { return options.initargs(); });
    }
  } catch (...) {
    impl_->forget_contexts();  // no destructor runs: the workers that took one drop it now
    throw;
  }
  impl_->dispatcher = std::make_unique<parallel::ThreadPool>(1);
}

RankPool::~RankPool() {
  impl_->cancel_queued();
  {
    std::unique_lock lock(impl_->mutex);
    impl_->closed = true;
    impl_->idle.wait(lock, [&] { return impl_->in_flight == 0; });
  }
  // The last completion's poke may still be queued on the dispatcher: it holds the Impl.
  impl_->dispatcher->terminate();
  impl_->forget_contexts();
}

const std::vector<std::string>& RankPool::workers() const { return impl_->workers; }

Future<c10::IValue> RankPool::apply_async(const std::string& function, dist::RpcArgs args) {
  Promise<c10::IValue> result;
  impl_->enqueue({function, std::move(args), result});
  return result.future();
}

c10::IValue RankPool::apply(const std::string& function, dist::RpcArgs args) {
  return apply_async(function, std::move(args)).wait();
}

std::vector<Future<c10::IValue>> RankPool::each(const std::string& function, std::vector<dist::RpcArgs> items,
                                                const char* origin) {
  std::vector<Future<c10::IValue>> calls;
  calls.reserve(items.size());
  for (auto& item : items) calls.push_back(apply_async(function, std::move(item)));
  return parallel::name_failures(calls, origin);
}

namespace {

std::vector<dist::RpcArgs> single(const std::vector<c10::IValue>& items) {
  std::vector<dist::RpcArgs> out;
  for (const auto& item : items) out.push_back({item});
  return out;
}

}  // namespace

std::vector<c10::IValue> RankPool::map(const std::string& function, const std::vector<c10::IValue>& items) {
  return wait_all(each(function, single(items), "push::server::RankPool::map"));
}

std::vector<c10::IValue> RankPool::starmap(const std::string& function, const std::vector<dist::RpcArgs>& items) {
  return wait_all(each(function, items, "push::server::RankPool::starmap"));
}

parallel::Results<c10::IValue> RankPool::imap(const std::string& function, const std::vector<c10::IValue>& items) {
  return parallel::Results<c10::IValue>(
      parallel::in_item_order(each(function, single(items), "push::server::RankPool::imap")));
}

parallel::Results<c10::IValue> RankPool::imap_unordered(const std::string& function,
                                                        const std::vector<c10::IValue>& items) {
  return parallel::Results<c10::IValue>(
      parallel::in_completion_order(each(function, single(items), "push::server::RankPool::imap_unordered")));
}

Future<std::vector<c10::IValue>> RankPool::map_async(const std::string& function,
                                                     const std::vector<c10::IValue>& items) {
  return collect_all(each(function, single(items), "push::server::RankPool::map_async"));
}

Future<std::vector<c10::IValue>> RankPool::starmap_async(const std::string& function,
                                                         const std::vector<dist::RpcArgs>& items) {
  return collect_all(each(function, items, "push::server::RankPool::starmap_async"));
}

size_t RankPool::cancel_queued() { return impl_->cancel_queued(); }

void RankPool::close() {
  std::lock_guard lock(impl_->mutex);
  impl_->closed = true;
}

void RankPool::join() {
  std::unique_lock lock(impl_->mutex);
  PUSH_CHECK(impl_->closed, kRankPool, "join() before close(): the pool still takes calls");
  impl_->idle.wait(lock, [&] { return impl_->queue.empty() && impl_->in_flight == 0; });
}

size_t RankPool::queued() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->queue.size();
}

}  // namespace push::server
