#include "distribution.h"

#include <algorithm>
#include <chrono>

#include "module_mirror.h"
#include "values.h"

#include <thread>

namespace py = pybind11;

namespace push::python {

Distribution::Distribution(py::object mk_module, py::object dispatch, PushOptions options)
    : mk_module_(std::make_shared<PyRef>(std::move(mk_module))),
      dispatch_(std::make_shared<PyRef>(std::move(dispatch))),
      threads_(std::make_shared<HandlerThreads>()) {
  // The factory runs on the thread that calls p_create (create() below, GIL released).
  ModuleFactory factory = [this]() -> torch::nn::AnyModule {
    py::gil_scoped_acquire gil;
    try {
      return torch::nn::AnyModule(ModuleMirror(mk_module_->object()));
    } catch (py::error_already_set& e) {
      // The runtime reports a failed factory as its own error; create() raises this one.
      factory_error_ = std::make_exception_ptr(PythonError(e));
      throw;
    } catch (py::builtin_exception&) {
      factory_error_ = std::current_exception();
      throw;
    }
  };
  py::gil_scoped_release unlocked;
  push_ = std::make_unique<Push>(std::move(factory), std::move(options));
}

Distribution::~Distribution() {
  py::gil_scoped_release unlocked;
  close_later();
}

bool Distribution::closed() const {
  std::shared_lock<std::shared_mutex> lock(push_mutex_);
  return push_ == nullptr;
}

Handler Distribution::handler(const std::string& message, py::object fn) const {
  if (message.rfind(kStashPrefix, 0) == 0) {
    throw py::value_error("push: messages beginning with '" + std::string(kStashPrefix) + "' are push's own, got '" +
                          message + "'");
  }
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error(c10::str("push: the handler for message '", message, "' is not callable (a ",
                                  py::str(py::type::handle_of(fn).attr("__name__")).cast<std::string>(), ")"));
  }
  return make_handler(message, std::make_shared<PyRef>(std::move(fn)), dispatch_, threads_);
}

Pid Distribution::create(const py::dict& receive, std::optional<int> device, std::optional<int> rank) {
  if (HandlerCall::current() != nullptr) {
    // Its module factory is Python, and the lane this handler holds may be the one the
    // particle goes to: create particles from outside handlers.
    throw py::value_error("push: p_create cannot be called from inside a handler");
  }
  ParticleOptions options;
  for (auto item : receive) {
    if (!py::isinstance<py::str>(item.first)) {
      throw py::type_error("push: the messages in receive must be str, got a " +
                           py::str(py::type::handle_of(item.first).attr("__name__")).cast<std::string>());
    }
    const auto message = item.first.cast<std::string>();
    options.on(message, handler(message, py::reinterpret_borrow<py::object>(item.second)));
  }
  // What save and load keep in the particle's state for the Python layer (its optimizer's
  // and scheduler's state): the state goes into push's checkpoint with the particle.
  options.on(kStashPut, [](Particle& p, const Args& a) {
    p.state()[a.at(0).toStringRef()] = a.at(1);
    return c10::IValue();
  });
  options.on(kStashTake, [](Particle& p, const Args& a) {
    auto it = p.state().find(a.at(0).toStringRef());
    if (it == p.state().end()) return c10::IValue();
    c10::IValue value = std::move(it->second);
    p.state().erase(it);
    return value;
  });
  if (device) options.device(*device);
  if (rank) options.rank(*rank);
  Pid pid = -1;
  std::exception_ptr factory_error;
  {
    // The lock without the GIL: the factory takes the GIL while this thread holds it.
    py::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> lock(create_mutex_);
    try {
      pid = held<Pid>([&](Push& p) {
        // With `rank`, the lane is that rank's, which p_create checks there.
        if (!rank && device && (*device < 0 || *device >= p.num_devices())) {
          throw py::value_error(c10::str("push: device ", *device, " does not exist: this distribution has ",
                                         p.num_devices(), " device lane(s), 0 to ", p.num_devices() - 1));
        }
        return p.p_create(std::move(options));
      });
    } catch (...) {
      factory_error = std::exchange(factory_error_, nullptr);
      if (!factory_error) throw;
    }
  }
  if (factory_error) {
    // The factory's own Python exception (TypeError for a non-module, the user's error
    // otherwise), with a note naming the particle it was making.
    try {
      std::rethrow_exception(factory_error);
    } catch (const PythonError& e) {
      py::object exc = e.exception();
      if (py::hasattr(exc, "add_note")) exc.attr("add_note")("push: while making the module of a new particle");
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      throw py::error_already_set();
    }
  }
  return pid;
}

PFuture Distribution::launch(Pid pid, const std::string& message, const py::args& args) {
  Args values = to_ivalues(args);
  py::gil_scoped_release unlocked;
  return held<PFuture>([&](Push& p) { return p.p_launch(pid, message, std::move(values)); });
}

namespace {

// The threads that close distributions for handlers and for the garbage collector; joined
// at exit (the package's atexit hook), before the interpreter goes.
std::mutex closers_mutex;
std::vector<std::thread>& closers() {
  static auto* threads = new std::vector<std::thread>();
  return *threads;
}

}  // namespace

Distribution::Stopping Distribution::take() {
  std::unique_lock<std::shared_mutex> lock(push_mutex_);
  if (!push_) return {};
  Stopping s;
  s.push = std::move(push_);
  s.done = std::make_shared<std::promise<void>>();
  stopped_ = std::make_shared<std::shared_future<void>>(s.done->get_future().share());
  return s;
}

void Distribution::close() {
  Stopping s = take();
  if (!s.push) {
    // Another thread is stopping it: wait until it has (not on a handler's thread, which
    // that stopping may itself wait for).
    std::shared_ptr<std::shared_future<void>> stopped;
    {
      std::shared_lock<std::shared_mutex> lock(push_mutex_);
      stopped = stopped_;
    }
    if (stopped && HandlerCall::current() == nullptr) stopped->wait();
    return;
  }
  if (HandlerCall::current() != nullptr) {
    hand_off(std::move(s));
  } else {
    stop(std::move(s), threads_);
  }
}

bool Distribution::wait_stopped(double seconds) const {
  std::shared_ptr<std::shared_future<void>> stopped;
  {
    std::shared_lock<std::shared_mutex> lock(push_mutex_);
    stopped = stopped_;
  }
  if (!stopped) return false;
  const auto wait = std::chrono::duration<double>(std::max(seconds, 0.0));
  return stopped->wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(wait)) == std::future_status::ready;
}

void Distribution::close_later() {
  Stopping s = take();
  if (s.push) hand_off(std::move(s));
}

void Distribution::stop(Stopping s, const std::shared_ptr<HandlerThreads>& threads) {
  // Stops the lanes: a handler waiting on another particle is cancelled there, and one
  // running Python code holds its lane until it returns. Then the threads are joined.
  s.push.reset();
  threads->close();
  s.done->set_value();
}

void Distribution::hand_off(Stopping s) {
  std::lock_guard<std::mutex> lock(closers_mutex);
  closers().emplace_back([s = std::move(s), threads = threads_]() mutable { stop(std::move(s), threads); });
}

void Distribution::join_closers() {
  for (;;) {
    std::vector<std::thread> batch;
    {
      std::lock_guard<std::mutex> lock(closers_mutex);
      batch.swap(closers());
    }
    if (batch.empty()) return;
    for (std::thread& t : batch) t.join();
  }
}

}  // namespace push::python
