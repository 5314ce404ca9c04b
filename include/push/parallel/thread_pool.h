#pragma once
// ThreadPool and CtxThreadPool: a fixed set of worker threads that run tasks, with
// machin's (and Python multiprocessing's) methods: apply, apply_async, map, map_async,
// imap, imap_unordered, starmap, starmap_async, and a per-thread initializer.
//
//   push::parallel::ThreadPool pool(4);
//   auto f = pool.apply_async([](int x) { return x * x; }, 7);       // push::Future<int>
//   std::vector<int> squares = pool.map([](int x) { return x * x; }, std::vector<int>{1, 2, 3});
//   auto stream = pool.imap_unordered(work, items);                  // in completion order
//   while (auto r = stream.next()) use(r->index, r->value);
//
//   // Each worker holds a context of its own (a model, a buffer), handed to its tasks:
//   push::parallel::CtxThreadPool<Net> nets(2, [](int worker) { return Net(); });
//   nets.map([](Net& net, const torch::Tensor& x) { return net->forward(x); }, batches);
//
// Each worker thread is a fiber event loop (as push's device lanes are): a task that
// waits on a push::Future (an RPC call, another task of the same pool, a collective)
// suspends and its thread runs the next queued task meanwhile, so tasks that wait on each
// other never deadlock the pool and waits never hold a thread. Tasks run one at a time per
// thread and interleave only at their waits. A task's exception reaches its future;
// map/starmap wait for every task and then rethrow the first failure in item order as a
// TaskError naming the item's index (imap: when that item is reached). Destruction
// cancels the tasks still queued (their futures fail with push::CancelledError) and joins
// every thread; running tasks finish first, and waiting ones are unwound.
//
// Thread safety: every method may be called from any number of threads at once, tasks of
// the pool included (submission takes the pool's lock; a submission after close() throws
// push::Error), except join(), terminate() and the destructor, which wait for the workers
// and so are refused from the pool's own tasks; destroy a pool only once no other thread
// uses it (ThreadPool.ThreadsMaySubmitAtOnceAndCloseWhileOthersSubmit).
#include <push/core/cores.h>
#include <push/core/errors.h>
#include <push/core/future.h>
#include <push/parallel/results.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace push::parallel {

/// The value of a task that returns `void` (folly's Unit): its future says only "done".
using Unit = std::monostate;

namespace detail {

/// The untyped pool: worker loops pulling tasks from one queue.
class PoolCore {
 public:
  using Run = std::function<void(int worker)>;
  using Cancel = std::function<void(std::exception_ptr)>;
  /// threads <= 0: push::usable_cores(). `initializer(worker)`, when given, runs once on
  /// each worker's thread before any task; its failure stops the pool and is thrown here,
  /// naming the worker.
  PoolCore(int threads, const char* origin, const std::function<void(int worker)>& initializer = {});
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;
  int size() const;
  /// Queues a task; push::Error after close() or terminate().
  void submit(Run run, Cancel cancel);
  void close();
  void join();
  size_t cancel_queued();
  void terminate();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// The value type of a task's future: what it returns, or Unit for void.
template <class T>
using TaskValue = std::conditional_t<std::is_void_v<T>, Unit, T>;

/// f(a...) as a task's value.
template <class F, class... A>
TaskValue<std::invoke_result_t<F, A...>> invoke_task(F& f, A&&... a) {
  if constexpr (std::is_void_v<std::invoke_result_t<F, A...>>) {
    std::invoke(f, std::forward<A>(a)...);
    return Unit{};
  } else {
    return std::invoke(f, std::forward<A>(a)...);
  }
}

}  // namespace detail

/// The typed methods over a PoolCore. Derived provides core() and invoke(f, worker,
/// args...), which calls f with the worker's context (CtxThreadPool) or without (ThreadPool).
template <class Derived>
class PoolMethods {
 public:
  /// f(a...) on some worker; its future.
  template <class F, class... A>
  auto apply_async(F f, A... a) {
    using T = decltype(std::declval<Derived&>().invoke(f, 0, a...));
    return submit<T>([this, f = std::move(f), args = std::make_tuple(std::move(a)...)](int worker) mutable {
      return std::apply([&](auto&... x) { return self().invoke(f, worker, x...); }, args);
    });
  }
  /// apply_async(f, a...).wait().
  template <class F, class... A>
  auto apply(F f, A... a) {
    return apply_async(std::move(f), std::move(a)...).wait();
  }

  /// f(item) for every item; the results in item order.
  template <class F, class Item>
  auto map(F f, const std::vector<Item>& items) {
    return wait_all(each_item(std::move(f), items, "push::parallel::ThreadPool::map"));
  }
  /// f(args...) for every tuple of arguments; the results in order.
  template <class F, class... T>
  auto starmap(F f, const std::vector<std::tuple<T...>>& items) {
    return wait_all(each_tuple(std::move(f), items, "push::parallel::ThreadPool::starmap"));
  }
  /// map without waiting: a future of every result in item order, failed (once every task
  /// has ended) with the first TaskError in item order. machin's map_async; its result's
  /// get, wait, ready and successful are the future's wait, wait_for, is_ready and
  /// !has_error, and a callback is then() or on_complete().
  template <class F, class Item>
  auto map_async(F f, const std::vector<Item>& items) {
    return collect_all(each_item(std::move(f), items, "push::parallel::ThreadPool::map_async"));
  }
  /// starmap without waiting, as map_async.
  template <class F, class... T>
  auto starmap_async(F f, const std::vector<std::tuple<T...>>& items) {
    return collect_all(each_tuple(std::move(f), items, "push::parallel::ThreadPool::starmap_async"));
  }
  /// f(item) for every item; the results one at a time, in item order.
  template <class F, class Item>
  auto imap(F f, const std::vector<Item>& items) {
    auto futures = each_item(std::move(f), items, "push::parallel::ThreadPool::imap");
    using T = typename decltype(futures)::value_type::value_type;
    return Results<T>(in_item_order(futures));
  }
  /// f(item) for every item; the results one at a time, as their tasks complete.
  template <class F, class Item>
  auto imap_unordered(F f, const std::vector<Item>& items) {
    auto futures = each_item(std::move(f), items, "push::parallel::ThreadPool::imap_unordered");
    using T = typename decltype(futures)::value_type::value_type;
    return Results<T>(in_completion_order(futures));
  }

  int size() const { return static_cast<const Derived&>(*this).core().size(); }
  /// No more tasks; queued ones still run.
  void close() { self().core().close(); }
  /// After close(): waits until every task has run, then stops the threads. Not from a task.
  void join() { self().core().join(); }
  /// Cancels the queued tasks that no thread has started (their futures fail with
  /// push::CancelledError); returns how many.
  size_t cancel_queued() { return self().core().cancel_queued(); }
  /// close(), cancel_queued(), then join (running tasks finish, waiting ones unwind).
  void terminate() { self().core().terminate(); }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }

  // One task: body(worker) -> T; its value or exception goes to the future.
  template <class T, class Body>
  Future<T> submit(Body body) {
    Promise<T> promise;
    self().core().submit(
        [promise, body = std::move(body)](int worker) mutable {
          try {
            promise.set_value(body(worker));
          } catch (...) {
            promise.set_error(std::current_exception());
          }
        },
        [promise](std::exception_ptr e) { promise.set_error(std::move(e)); });
    return promise.future();
  }

  // f(item) as one task per item.
  template <class F, class Item>
  auto each_item(F f, const std::vector<Item>& items, const char* origin) {
    return each(
        std::move(f), items, [](auto& self, auto& fn, int w, const Item& x) { return self.invoke(fn, w, x); }, origin);
  }
  // f(args...) as one task per tuple of arguments.
  template <class F, class... T>
  auto each_tuple(F f, const std::vector<std::tuple<T...>>& items, const char* origin) {
    return each(
        std::move(f), items,
        [](auto& self, auto& fn, int w, const std::tuple<T...>& x) {
          return std::apply([&](const auto&... a) { return self.invoke(fn, w, a...); }, x);
        },
        origin);
  }

  // One task per item, sharing f; a failure (cancellation included) becomes a TaskError
  // naming the item.
  template <class F, class Item, class Call>
  auto each(F f, const std::vector<Item>& items, Call call, const char* origin) {
    using T = decltype(call(std::declval<Derived&>(), f, 0, items.front()));
    auto shared = std::make_shared<F>(std::move(f));
    std::vector<Future<T>> futures;
    futures.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      futures.push_back(
          submit<T>([this, shared, call, item = items[i]](int worker) { return call(self(), *shared, worker, item); }));
    }
    return name_failures(futures, origin);
  }
};

/// A pool of `threads` workers (<= 0: one per core it may run on, push::usable_cores()).
/// `initializer(worker)` runs once on each worker's thread before its first task (machin's
/// initializer and initargs: bind the arguments into it), for what lives in the thread
/// (torch::set_num_threads, a thread-local generator); when it throws on a worker, the
/// constructor stops the pool and throws push::Error naming that worker.
class ThreadPool : public PoolMethods<ThreadPool> {
 public:
  explicit ThreadPool(int threads = 0, const std::function<void(int worker)>& initializer = {})
      : core_(threads, "push::parallel::ThreadPool", initializer) {}
  // Tasks hold the pool's address.
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  template <class F, class... A>
  auto invoke(F& f, int /*worker*/, A&&... a) {
    return detail::invoke_task(f, std::forward<A>(a)...);
  }
  detail::PoolCore& core() { return core_; }
  const detail::PoolCore& core() const { return core_; }

 private:
  detail::PoolCore core_;
};

/// A pool whose workers each hold a context (made by `make(worker)` on construction);
/// every task is called as f(context, args...) with its worker's context.
template <class Ctx>
class CtxThreadPool : public PoolMethods<CtxThreadPool<Ctx>> {
 public:
  CtxThreadPool(int threads, const std::function<Ctx(int worker)>& make) {
    const int n = threads > 0 ? threads : usable_cores();
    contexts_.reserve(n);
    for (int w = 0; w < n; ++w) contexts_.push_back(make(w));
    core_ = std::make_unique<detail::PoolCore>(n, "push::parallel::CtxThreadPool");
  }
  // Tasks hold the pool's address.
  CtxThreadPool(const CtxThreadPool&) = delete;
  CtxThreadPool& operator=(const CtxThreadPool&) = delete;
  /// Worker `w`'s context (for reading after the tasks are done).
  Ctx& context(int w) { return contexts_.at(w); }

  template <class F, class... A>
  auto invoke(F& f, int worker, A&&... a) {
    return detail::invoke_task(f, contexts_[worker], std::forward<A>(a)...);
  }
  detail::PoolCore& core() { return *core_; }
  const detail::PoolCore& core() const { return *core_; }

 private:
  std::vector<Ctx> contexts_;
  std::unique_ptr<detail::PoolCore> core_;  // after contexts_: its threads stop first
};

}  // namespace push::parallel
