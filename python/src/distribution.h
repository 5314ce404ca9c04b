#pragma once
// push::Push for Python: particles whose modules are Python torch.nn.Modules and whose
// handlers are Python functions (the Python package's push.PusH is built on this).
//
// Thread-safe: any Python thread may call it, a handler's too (what would wait on a lane
// goes through the handler's fiber, handler_bridge.h). Every call takes the runtime under
// a shared lock after releasing the GIL, and close() takes it exclusively: the runtime
// stops on the thread that closes, never on one that happened to hold it last.
#include "handler_bridge.h"
#include "handler_threads.h"

#include <push/runtime/push.h>

#include <pybind11/pybind11.h>

#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

namespace push::python {

class Distribution {
 public:
  /// `mk_module()` makes a particle's module (under the particle's seed, as in C++);
  /// `dispatch(call, fn, args)` runs a handler on a handler thread. Call with the GIL.
  Distribution(pybind11::object mk_module, pybind11::object dispatch, PushOptions options);
  /// Hands the closing to a closer thread when the distribution is still open (it may be
  /// destroyed on any thread, a lane's or a handler's among them).
  ~Distribution();

  /// A particle on lane `device` answering `receive` ({message: fn}); returns its pid (the
  /// Python package keeps what its `mk_module` made). Not from inside a handler.
  /// Messages every Python particle answers, for save and load: put(key, value) into its
  /// state, take(key) out of it (None when absent). Users' messages may not begin so.
  static constexpr const char* kStashPrefix = "push.python/";
  static constexpr const char* kStashPut = "push.python/put";
  static constexpr const char* kStashTake = "push.python/take";
  Pid create(const pybind11::dict& receive, std::optional<int> device, std::optional<int> rank);
  PFuture launch(Pid pid, const std::string& message, const pybind11::args& args);
  /// A handler for a Python function, to register on a particle from its handler.
  Handler handler(const std::string& message, pybind11::object fn) const;

  /// Runs `fn(push)` with the GIL released and the runtime held; from a handler's thread
  /// inside the handler's fiber (where waiting on a lane does not block it). Throws
  /// ValueError once closed. Call with the GIL.
  template <class T>
  T run(const std::function<T(Push&)>& fn) const {
    if (HandlerCall* call = HandlerCall::current()) {
      return call->on_lane<T>([&](Particle&) { return held(fn); });
    }
    pybind11::gil_scoped_release unlocked;
    return held(fn);
  }

  /// The same for `fn` without a result.
  void run(const std::function<void(Push&)>& fn) const {
    run<int>([&](Push& p) {
      fn(p);
      return 0;
    });
  }

  /// Runs `fn(push)` with the GIL released and the runtime held, on this thread: for
  /// what does not wait on a lane. Call with the GIL.
  template <class T>
  T query(const std::function<T(Push&)>& fn) const {
    pybind11::gil_scoped_release unlocked;
    return held(fn);
  }

  /// Stops the runtime (handlers waiting are cancelled; one running Python code keeps its
  /// lane until it returns) and joins every thread; returns once stopped, whoever stops it.
  /// On a handler's thread, which the stopping waits for, it is handed to a closer thread
  /// (joined at exit) instead. Call without the GIL. Idempotent.
  void close();
  /// The same, always handed to a closer thread (for garbage collection).
  void close_later();
  bool closed() const;
  /// Whether the stopping close() or close_later() began has ended, waiting at most
  /// `seconds` for it (false when no close began). Call without the GIL.
  bool wait_stopped(double seconds) const;
  std::size_t handler_threads() const { return threads_->threads(); }
  /// Joins the closer threads (at exit, without the GIL).
  static void join_closers();

 private:
  template <class T>
  T held(const std::function<T(Push&)>& fn) const {
    std::shared_lock<std::shared_mutex> lock(push_mutex_);
    if (!push_) throw pybind11::value_error("push: the distribution is closed");
    return fn(*push_);
  }
  struct Stopping {
    std::unique_ptr<Push> push;                // null when another close() took it first
    std::shared_ptr<std::promise<void>> done;  // set once it is stopped
  };
  Stopping take();
  static void stop(Stopping s, const std::shared_ptr<HandlerThreads>& threads);
  void hand_off(Stopping s);

  std::shared_ptr<PyRef> mk_module_;
  std::shared_ptr<PyRef> dispatch_;
  std::shared_ptr<HandlerThreads> threads_;
  std::mutex create_mutex_;           // one p_create at a time: factory_error_ is its factory's
  std::exception_ptr factory_error_;  // what the factory raised, for create() to raise
  mutable std::shared_mutex push_mutex_;
  std::unique_ptr<Push> push_;
  std::shared_ptr<std::shared_future<void>> stopped_;  // set by whoever stops the runtime
};

}  // namespace push::python
