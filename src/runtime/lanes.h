#pragma once
// The device lanes of one distribution: how many and how they are set up (PushOptions),
// and the one way other code runs something on a lane and gets its future.
#include <push/core/future.h>
#include <push/runtime/options.h>

#include <functional>
#include <memory>
#include <vector>

#include "runtime/lane.h"

namespace push::detail {

class Lanes {
 public:
  /// How many lanes `options` asks for (with CUDA: every GPU by default; without: 1);
  /// throws push::Error for a bad count. Known before the lanes exist: other ranks learn
  /// it while the distribution is formed.
  static int count(const PushOptions& options);

  /// Starts `count` lanes set up as `options` says. `ranks_on_host` ranks of the job share
  /// this host's cores, so each lane's default intra-op thread count divides them.
  Lanes(const PushOptions& options, int count, int ranks_on_host);
  /// Stops every lane (see stop()).
  ~Lanes();
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  /// Cancels queued work, unwinds suspended handlers and joins every lane. Idempotent;
  /// not on one of these lanes (a lane cannot join itself).
  void stop();

  int size() const { return static_cast<int>(lanes_.size()); }
  Lane& at(int index) { return *lanes_.at(static_cast<size_t>(index)); }
  const Lane& at(int index) const { return *lanes_.at(static_cast<size_t>(index)); }
  /// A handle that outlives the distribution (a continuation may run after it is gone).
  std::weak_ptr<Lane> weak(int index) const { return lanes_.at(static_cast<size_t>(index)); }
  /// Whether this thread is one of these lanes (inside one of their handlers, say).
  bool owns_current_thread() const;

  /// Runs `fn` on lane `lane`'s loop as an inline job (at once when this thread is that
  /// lane) and returns its future.
  template <class T>
  Future<T> call(int lane, std::function<T()> fn);

 private:
  std::vector<std::shared_ptr<Lane>> lanes_;
};

template <class T>
Future<T> Lanes::call(int lane, std::function<T()> fn) {
  Promise<T> promise;
  auto run = [promise, fn = std::move(fn)] {
    try {
      promise.set_value(fn());
    } catch (...) {
      promise.set_error(std::current_exception());
    }
  };
  Lane& target = at(lane);
  if (Lane::current() == &target) {
    run();
  } else {
    target.post_inline(std::move(run), [promise](std::exception_ptr e) { promise.set_error(std::move(e)); });
  }
  return promise.future();
}

}  // namespace push::detail
