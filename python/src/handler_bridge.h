#pragma once
// A Python handler seen from push's runtime: a C++ handler whose fiber hands the call to a
// Python thread (handler_threads.h) and serves it until the Python function returns.
//
// The lane stays the particle's one owner, as for a C++ handler. While the Python function
// runs, its fiber holds the lane: the lane's thread waits (blocked, not suspended), so the
// particle stays pinned and nothing else on the lane touches it, and the Python code may
// compute on the particle as a C++ handler would. What the function asks of the runtime
// (send, get, register_receive, and every wait) is posted to the fiber, which runs it on
// the lane; a wait there suspends the fiber, and the lane runs other particles (other
// Python handlers on their own threads) until the result is in. The Python thread waits
// for each answer with the GIL released.
#include <push/core/errors.h>
#include <push/runtime/particle.h>

#include <c10/core/Stream.h>
#include <pybind11/pybind11.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace push::python {

class HandlerThreads;

/// A Python object a C++ value may own on any thread: released under the GIL.
struct PyRef {
  explicit PyRef(pybind11::object o) : object(std::move(o)) {}
  ~PyRef();
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  pybind11::object object;
};

/// An exception a Python handler raised, carried through the runtime to whoever waits.
class PythonError : public std::runtime_error {
 public:
  explicit PythonError(pybind11::error_already_set& error);
  /// The exception object; touch it only with the GIL held.
  const pybind11::object& exception() const { return exception_->object; }

 private:
  std::shared_ptr<PyRef> exception_;
};

/// A request to a handler that has ended: its particle is no longer the caller's to use.
class HandlerEnded : public CancelledError {
 public:
  using CancelledError::CancelledError;
};

/// One running Python handler: the channel between its fiber and its Python thread.
class HandlerCall {
 public:
  HandlerCall(Pid pid, std::string message) : pid_(pid), message_(std::move(message)) {}

  Pid pid() const { return pid_; }
  const std::string& message() const { return message_; }

  /// The call whose Python function runs on this thread, or null (a user's thread).
  static HandlerCall* current();

  /// Python thread, GIL held: runs `fn` on the particle's lane, in the handler's fiber
  /// (where a wait suspends the fiber), and returns its result or throws its exception;
  /// waits with the GIL released. Throws HandlerEnded once the handler has ended. Any
  /// thread may call it (one a handler started too): requests are served one at a time.
  template <class T>
  T on_lane(std::function<T(Particle&)> fn) {
    auto reply = std::make_shared<std::promise<T>>();
    std::future<T> answer = reply->get_future();
    auto op = [fn = std::move(fn), reply](Particle& p) {
      try {
        reply->set_value(fn(p));
      } catch (...) {
        reply->set_exception(std::current_exception());
      }
    };
    // The GIL goes before the request lock is taken: another thread of this handler may
    // hold the lock while it waits for the GIL.
    pybind11::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> one_at_a_time(request_mutex_);
    post(std::move(op));
    try {
      return answer.get();
    } catch (const std::future_error&) {
      throw ended();  // the fiber was gone before it ran the request
    }
  }

  /// Whether the Python function still runs (its particle may be used).
  bool active();

  /// Python thread: the function returned `value` or raised `error`.
  void finish(c10::IValue value);
  void fail(std::exception_ptr error);

  /// The fiber: runs the function on `threads` and serves its requests until it returns;
  /// returns its value or throws its exception.
  c10::IValue serve(Particle& particle, const std::function<void()>& start);

 private:
  void post(std::function<void(Particle&)> op);
  HandlerEnded ended() const;

  Pid pid_;
  std::string message_;
  std::mutex request_mutex_;  // one request at a time, from whichever Python thread
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void(Particle&)> op_;  // the request waiting for the fiber
  bool finished_ = false;              // the function returned or raised
  bool ended_ = false;                 // serve() returned: nobody runs requests any more
  c10::IValue value_;
  std::exception_ptr error_;
};

/// Marks this thread as running `call`'s Python function while it lives.
class CurrentCall {
 public:
  explicit CurrentCall(HandlerCall* call);
  ~CurrentCall();
  CurrentCall(const CurrentCall&) = delete;
  CurrentCall& operator=(const CurrentCall&) = delete;

 private:
  HandlerCall* previous_;
};

/// The C++ handler for the Python handler `fn` of `message`: `dispatch(call, fn, args)`
/// (the Python package's) runs on a handler thread and builds the particle `fn` sees.
Handler make_handler(std::string message, std::shared_ptr<PyRef> fn, std::shared_ptr<PyRef> dispatch,
                     std::shared_ptr<HandlerThreads> threads);

}  // namespace push::python
