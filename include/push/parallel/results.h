#pragma once
// The results of a pool's tasks (ThreadPool, push::server::RankPool): a failed task's
// error naming its item, and futures combined into item order or completion order.
//
//   std::vector<push::Future<int>> fs = ...;                 // one per item
//   auto named = push::parallel::name_failures(fs, "my_map");  // failures name their item
//   push::parallel::Results<int> rs(push::parallel::in_completion_order(named));
//   while (auto r = rs.next()) use(r->index, r->value);
#include <push/core/errors.h>
#include <push/core/future.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace push::parallel {

/// A task of map/imap/starmap failed: which item, and the original exception.
class TaskError : public Error {
 public:
  TaskError(const char* origin, size_t index, std::exception_ptr cause)
      : Error(c10::str("[", origin, "] task ", index, " failed: ", push::detail::describe(cause))),
        index_(index),
        cause_(std::move(cause)) {}
  size_t index() const { return index_; }
  const std::exception_ptr& cause() const { return cause_; }

 private:
  size_t index_;
  std::exception_ptr cause_;
};

/// One result of imap / imap_unordered: the item's index and its task's value.
template <class T>
struct Indexed {
  size_t index;
  T value;
};

/// Results of imap (item order) or imap_unordered (completion order), one at a time.
template <class T>
class Results {
 public:
  explicit Results(std::vector<Future<Indexed<T>>> slots) : slots_(std::move(slots)) {}
  /// The next result (waiting for it), or nothing once all were returned. A failed task
  /// throws its TaskError here; next() after it goes on with the following results.
  std::optional<Indexed<T>> next() {
    if (next_ == slots_.size()) return std::nullopt;
    return slots_[next_++].wait();
  }
  /// next(), waiting at most `timeout` (machin's next(timeout)): push::Error when the next
  /// result is not there by then; a later next() waits for the same one again.
  template <class Rep, class Period>
  std::optional<Indexed<T>> next(std::chrono::duration<Rep, Period> timeout) {
    if (next_ == slots_.size()) return std::nullopt;
    PUSH_CHECK(slots_[next_].wait_for(timeout), "push::parallel::Results::next", "result ", next_, " of ",
               slots_.size(), " is not there within ",
               std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms");
    return slots_[next_++].wait();
  }
  size_t size() const { return slots_.size(); }

 private:
  std::vector<Future<Indexed<T>>> slots_;
  size_t next_ = 0;
};

/// futures[i], whose failure becomes a TaskError naming i.
template <class T>
std::vector<Future<T>> name_failures(const std::vector<Future<T>>& futures, const char* origin) {
  std::vector<Future<T>> out;
  out.reserve(futures.size());
  for (size_t i = 0; i < futures.size(); ++i) {
    out.push_back(futures[i].then_complete([i, origin](const Future<T>& done) {
      if (auto error = done.error()) throw TaskError(origin, i, error);
      return done.wait();
    }));
  }
  return out;
}

/// futures[i] as (i, value), in item order.
template <class T>
std::vector<Future<Indexed<T>>> in_item_order(const std::vector<Future<T>>& futures) {
  std::vector<Future<Indexed<T>>> out;
  out.reserve(futures.size());
  for (size_t i = 0; i < futures.size(); ++i) {
    out.push_back(futures[i].then([i](const T& v) { return Indexed<T>{i, v}; }));
  }
  return out;
}

/// The same in the order the futures complete: each completion fills the next slot.
template <class T>
std::vector<Future<Indexed<T>>> in_completion_order(const std::vector<Future<T>>& futures) {
  struct Order {
    std::mutex mutex;
    size_t done = 0;
    std::vector<Promise<Indexed<T>>> slots;
  };
  auto order = std::make_shared<Order>();
  std::vector<Future<Indexed<T>>> out;
  for (size_t i = 0; i < futures.size(); ++i) {
    order->slots.emplace_back();
    out.push_back(order->slots.back().future());
  }
  for (size_t i = 0; i < futures.size(); ++i) {
    Future<T> done = futures[i];
    done.on_complete([done, order, i] {
      const Promise<Indexed<T>> slot = [&] {
        std::lock_guard lock(order->mutex);
        return order->slots[order->done++];
      }();
      if (auto error = done.error()) {
        slot.set_error(error);
      } else {
        slot.set_value(Indexed<T>{i, done.wait()});
      }
    });
  }
  return out;
}

}  // namespace push::parallel
