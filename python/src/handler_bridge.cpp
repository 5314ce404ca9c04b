#include "handler_bridge.h"

#include "handler_threads.h"
#include "values.h"

#include <ATen/Parallel.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace py = pybind11;

namespace push::python {
namespace {
thread_local HandlerCall* current_call = nullptr;
}  // namespace

PyRef::~PyRef() {
  if (!object) return;
  py::gil_scoped_acquire gil;
  object = py::object();
}

PythonError::PythonError(py::error_already_set& error)
    : std::runtime_error(error.what()), exception_([&] {
        py::gil_scoped_acquire gil;
        // The handler's frames stay with the exception: raised again in the waiter, its
        // traceback goes on from them (raise_python).
        const auto kept = py::reinterpret_steal<py::object>(PyException_GetTraceback(error.value().ptr()));
        if (error.trace() && !kept) PyException_SetTraceback(error.value().ptr(), error.trace().ptr());
        return std::make_shared<PyRef>(error.value());
      }()) {}

CurrentCall::CurrentCall(HandlerCall* call) : previous_(current_call) { current_call = call; }
CurrentCall::~CurrentCall() { current_call = previous_; }

HandlerCall* HandlerCall::current() { return current_call; }

HandlerEnded HandlerCall::ended() const {
  return HandlerEnded(c10::str("[push] particle ", pid_, "'s handler for '", message_,
                               "' has ended: its particle can only be used while the handler runs"));
}

bool HandlerCall::active() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !finished_ && !ended_;
}

void HandlerCall::post(std::function<void(Particle&)> op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ended_ || finished_) throw ended();
    op_ = std::move(op);
  }
  changed_.notify_all();
}

void HandlerCall::finish(c10::IValue value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    value_ = std::move(value);
  }
  changed_.notify_all();
}

void HandlerCall::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    error_ = std::move(error);
  }
  changed_.notify_all();
}

c10::IValue HandlerCall::serve(Particle& particle, const std::function<void()>& start) {
  // However this ends, a request still waiting is dropped: its reply is broken, and the
  // Python thread's on_lane() raises instead of waiting for ever.
  struct End {
    HandlerCall& call;
    ~End() {
      std::function<void(Particle&)> dropped;
      {
        std::lock_guard<std::mutex> lock(call.mutex_);
        call.ended_ = true;
        dropped = std::move(call.op_);
      }
    }
  } end{*this};
  start();
  for (;;) {
    std::function<void(Particle&)> op;
    {
      // The lane's thread waits here, blocked: the particle is the lane's running one.
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return op_ != nullptr || finished_; });
      if (op_) {
        op = std::move(op_);
        op_ = nullptr;
      }
    }
    if (op) {
      op(particle);
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    return std::move(value_);
  }
}

Handler make_handler(std::string message, std::shared_ptr<PyRef> fn, std::shared_ptr<PyRef> dispatch,
                     std::shared_ptr<HandlerThreads> threads) {
  return [message = std::move(message), fn = std::move(fn), dispatch = std::move(dispatch),
          threads = std::move(threads)](Particle& particle, const Args& args) -> c10::IValue {
    auto call = std::make_shared<HandlerCall>(particle.pid(), message);
    // The handler thread computes on the lane's device and stream, and with the lane's
    // intra-op threads, as the lane would (read here, on the lane's thread). A new thread's
    // count is the process's default (every core), not the lane's: its own OpenMP team then
    // spins beside the lane's, 4x slower on 2 cores (docs/python.md, "How Python handlers run").
    const torch::Device device = particle.device();
    const c10::Stream stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
    const int intra_op_threads = at::get_num_threads();
    return call->serve(particle, [&] {
      threads->run([call, fn, dispatch, args, stream, intra_op_threads]() -> std::function<void()> {
        if (at::get_num_threads() != intra_op_threads) at::set_num_threads(intra_op_threads);
        c10::StreamGuard on_lane_stream(stream);
        CurrentCall running(call.get());
        py::gil_scoped_acquire gil;
        try {
          py::object result = dispatch->object(py::cast(call), fn->object, to_python(args));
          return [call, value = to_ivalue(result)]() mutable { call->finish(std::move(value)); };
        } catch (py::error_already_set& e) {
          return [call, error = std::make_exception_ptr(PythonError(e))] { call->fail(error); };
        } catch (...) {
          return [call, error = std::current_exception()] { call->fail(error); };
        }
      });
    });
  };
}

}  // namespace push::python
