#pragma once
// Future<T>: the result of asynchronous work: a particle's message, a remote call, ...
//
//   push::PFuture f = dist.p_launch(pid, "train", x);
//   f.then([](const c10::IValue& loss) { ... });   // runs where f completes
//   c10::IValue v = f.wait();                      // rethrows a particle's exception
//   if (!f.wait_for(std::chrono::milliseconds(50))) { /* not done yet */ }
//
// wait() and wait_for() are fiber-aware: inside a fiber job of one of push's event loops
// (a particle handler runs in one, on its device's lane) they suspend that fiber and let
// the loop run other work (including the work being waited on), so handlers may wait on
// their own loop without deadlock; wait_for()'s deadline is a timer of that loop. On any
// other thread they block; on a loop's thread outside a fiber (an inline job) they throw
// rather than block the loop. wait() returns a copy of the value (for tensors and IValues
// a reference count), which stays valid after the future is gone. Inside a backward pass
// (a tensor or module hook run by the autograd engine) a handler cannot be suspended:
// waiting there on a pending future is an error. All members are thread-safe.
// Continuations run on the thread that completes the future (or at once if it is already
// complete): keep them short and never wait in them; one that throws is reported and does
// not stop the others.
#include <ATen/core/ivalue.h>
#include <c10/util/FunctionRef.h>

#include <push/core/errors.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace push {
namespace detail {

/// The type-independent part of a future's shared state.
class FutureCore {
 public:
  virtual ~FutureCore() = default;
  bool ready() const { return ready_.load(std::memory_order_acquire); }

  /// Blocks (plain thread) or suspends (a fiber job of an event loop) until ready.
  void wait_ready();
  /// Like wait_ready(), for at most `timeout`; true when ready.
  bool wait_ready_for(std::chrono::nanoseconds timeout);

  /// Runs `callback` once ready (immediately, on this thread, if already ready).
  void add_callback(std::function<void()> callback);

  /// Promise::expect_within.
  void expect_within(std::chrono::nanoseconds window);
  /// Checks ready() without sleeping until the expect_within() window ends, at most
  /// `limit` from now, stopping early when `stop()` says so; returns ready(). At most one
  /// thread fewer than the cores the caller may run on (push::usable_cores(); none on one
  /// core) looks at a time, process-wide: the others return at once.
  bool spin_until_ready(std::chrono::nanoseconds limit, const std::function<bool()>& stop = {}) const;
  std::exception_ptr error() const {
    return error_;  // written before ready_ is published
  }
  void rethrow_if_error() const {
    if (error_) std::rethrow_exception(error_);
  }

 protected:
  /// Completes the future: `store` (which writes the value) and the error are applied only
  /// when it is not complete yet; a second completion throws push::Error and changes nothing.
  void mark_ready(std::exception_ptr error, c10::function_ref<void()> store);

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> ready_{false};
  std::atomic<int64_t> spin_until_ns_{0};  // expect_within()'s end, on steady_clock
  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;
};

template <class T>
class FutureState final : public FutureCore {
 public:
  void set_value(T value) {
    mark_ready(nullptr, [&] { value_.emplace(std::move(value)); });
  }
  void set_error(std::exception_ptr error) {
    mark_ready(std::move(error), [] {});
  }
  const T& value() const { return *value_; }

 private:
  std::optional<T> value_;
};

}  // namespace detail

template <class T>
class Promise;

template <class T>
class Future {
 public:
  using value_type = T;

  /// An empty future (valid() is false): every other member throws push::Error.
  Future() = default;

  /// A future that is already complete.
  static Future ready(T value) {
    Promise<T> promise;
    promise.set_value(std::move(value));
    return promise.future();
  }
  static Future failed(std::exception_ptr error) {
    Promise<T> promise;
    promise.set_error(std::move(error));
    return promise.future();
  }

  bool valid() const { return state_ != nullptr; }
  bool is_ready() const { return check().ready(); }
  bool has_error() const { return is_ready() && state_->error() != nullptr; }
  /// The error of a complete future; null while it is pending or when it has a value.
  std::exception_ptr error() const { return is_ready() ? state_->error() : nullptr; }

  /// Waits, then returns (a copy of) the value or rethrows the error. By value, so that
  /// `const auto& v = make_future().wait();` does not refer into a destroyed future.
  T wait() const {
    auto& state = check();
    state.wait_ready();
    state.rethrow_if_error();
    return state.value();
  }
  T get() const { return wait(); }
  /// The value (or the error) once complete within `timeout`; else a push::Error saying so,
  /// and the future stays pending (machin's AsyncResult.get(timeout)).
  template <class Rep, class Period>
  T get(std::chrono::duration<Rep, Period> timeout) const {
    if (!wait_for(timeout)) {
      throw Error(c10::str("[push::Future::get] no result within ",
                           std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms"));
    }
    return wait();
  }
  /// Waits until the future is complete, value or error, and rethrows nothing (before the
  /// buffers of the work it stands for are reused, say). Fiber-aware as wait().
  void wait_ready() const { check().wait_ready(); }

  /// Waits at most `timeout`; true when the future is complete. Inside a handler (a fiber
  /// job) it is suspended until completion or the deadline, whichever comes first.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    // Clamped so that "wait a century" cannot overflow nanoseconds or the clock.
    constexpr std::chrono::duration<double> kLongest = std::chrono::hours(24 * 365 * 100);
    const auto ns = std::chrono::duration<double>(timeout) >= kLongest
                        ? std::chrono::duration_cast<std::chrono::nanoseconds>(kLongest)
                        : std::chrono::duration_cast<std::chrono::nanoseconds>(timeout);
    return check().wait_ready_for(ns);
  }

  /// A future of f(value); an error skips f and propagates.
  template <class F>
  auto then(F&& f) const -> Future<std::invoke_result_t<F, const T&>> {
    using U = std::invoke_result_t<F, const T&>;
    static_assert(!std::is_void_v<U>, "a continuation must return a value");
    return then_complete([fn = std::forward<F>(f)](const Future& done) mutable {
      done.state_->rethrow_if_error();
      return fn(done.state_->value());
    });
  }

  /// A future of f(this future), called once this one is complete, with its value or its
  /// error (f reads them with wait(), which no longer waits, or error()); what f throws
  /// fails the returned future. For continuations that handle errors themselves.
  template <class F>
  auto then_complete(F&& f) const -> Future<std::invoke_result_t<F, const Future&>> {
    using U = std::invoke_result_t<F, const Future&>;
    static_assert(!std::is_void_v<U>, "a continuation must return a value");
    Promise<U> next;
    Future self = *this;
    check().add_callback([self, next, fn = std::forward<F>(f)]() mutable {
      try {
        next.set_value(fn(self));
      } catch (...) {
        next.set_error(std::current_exception());
      }
    });
    return next.future();
  }

  /// Calls `f()` once the future is complete (at once, on this thread, when it is already).
  template <class F>
  void on_complete(F&& f) const {
    check().add_callback(std::function<void()>(std::forward<F>(f)));
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<detail::FutureState<T>> state) : state_(std::move(state)) {}
  detail::FutureState<T>& check() const {
    if (!state_) throw Error("[push::Future] this future is empty (default-constructed or moved from)");
    return *state_;
  }
  std::shared_ptr<detail::FutureState<T>> state_;
};

/// The producer side of a Future: the one way to make a future of work push does not run
/// itself (another thread, a callback, a data loader). Copies complete the same future,
/// once: a second set_value or set_error throws push::Error and changes nothing. When the
/// last copy goes without completing it, its future fails with a "broken promise" error,
/// so no waiter hangs on it.
template <class T>
class Promise {
 public:
  Promise() : link_(std::make_shared<Link>()) {}

  Future<T> future() const { return Future<T>(check().state); }
  void set_value(T value) const { check().state->set_value(std::move(value)); }
  void set_error(std::exception_ptr error) const { check().state->set_error(std::move(error)); }
  /// Whether the future is complete already.
  bool is_set() const { return check().state->ready(); }
  /// A hint for the future's waiters: it is likely complete within `window` (a reply to a
  /// request just sent, say). A plain thread waiting on it, or a fiber whose loop has
  /// nothing else to run, then checks for completion without sleeping for up to `window`
  /// before it sleeps: on a busy-enough machine, waking a sleeping thread costs about as
  /// much as a round trip over loopback. The window counts from this call, not from each
  /// wait (a later wait_for looks only for what is left of it); at most an hour. Costs
  /// the waiters' CPU for that long at most. 0 (the default): sleep at once.
  void expect_within(std::chrono::nanoseconds window) const { check().state->expect_within(window); }

 private:
  struct Link {
    std::shared_ptr<detail::FutureState<T>> state = std::make_shared<detail::FutureState<T>>();
    Link() = default;
    Link(const Link&) = delete;
    Link& operator=(const Link&) = delete;
    ~Link() {
      if (state->ready()) return;
      try {
        state->set_error(std::make_exception_ptr(Error("[push::Promise] broken promise: destroyed without a value")));
      } catch (const Error&) {
        // Completed meanwhile by another thread's copy of the future's producer.
      }
    }
  };
  Link& check() const {
    if (!link_) throw Error("[push::Promise] this promise was moved from");
    return *link_;
  }
  std::shared_ptr<Link> link_;
};

/// The future of a particle message or operation.
using PFuture = Future<c10::IValue>;

/// Waits until every future is complete, then returns their values in order or
/// rethrows the first error (no work is left running behind an early throw).
template <class T>
std::vector<T> wait_all(const std::vector<Future<T>>& futures) {
  for (const auto& f : futures) {
    if (f.valid()) f.wait_ready();
  }
  std::vector<T> out;
  out.reserve(futures.size());
  for (const auto& f : futures) out.push_back(f.wait());
  return out;
}

/// A future of every value in order, complete once every future is: failed with the first
/// error in order when one failed (no work is left running behind it). Empty: complete now.
template <class T>
Future<std::vector<T>> collect_all(const std::vector<Future<T>>& futures) {
  struct All {
    explicit All(const std::vector<Future<T>>& f) : futures(f), left(f.size()) {}
    std::vector<Future<T>> futures;  // released with the last callback, once every one ran
    std::atomic<size_t> left;
    Promise<std::vector<T>> promise;
  };
  auto all = std::make_shared<All>(futures);
  auto done = all->promise.future();
  if (futures.empty()) {
    all->promise.set_value({});
    return done;
  }
  for (const auto& f : futures) {
    f.on_complete([all] {
      if (all->left.fetch_sub(1) != 1) return;
      for (const auto& g : all->futures) {
        if (auto error = g.error()) {
          all->promise.set_error(error);
          return;
        }
      }
      std::vector<T> out;
      out.reserve(all->futures.size());
      for (const auto& g : all->futures) out.push_back(g.wait());
      all->promise.set_value(std::move(out));
    });
  }
  return done;
}

}  // namespace push
