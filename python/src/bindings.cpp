// The extension module push._push: what the Python package (python/push/) is built on.
#include "bayes_bindings.h"
#include "distribution.h"
#include "values.h"
#include "world_bindings.h"

#include <push/core/cores.h>
#include <push/core/errors.h>
#include <push/core/seed.h>
#include <push/runtime/view.h>

#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <map>
#include <optional>
#include <span>
#include <vector>

namespace py = pybind11;
using namespace push;
using namespace push::python;

namespace {

// Never released: module globals would be destroyed after the interpreter has gone.
py::handle particle_error_type;
py::handle cancelled_error_type;

// A wait that timed out, raised as TimeoutError.
struct WaitTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Sets the Python error for push's own exceptions; false for any other.
bool set_push_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CancelledError& e) {
    PyErr_SetString(cancelled_error_type.ptr(), e.what());
  } catch (const ParticleError& e) {
    PyErr_SetString(particle_error_type.ptr(), e.what());
  } catch (const WaitTimeout& e) {
    PyErr_SetString(PyExc_TimeoutError, e.what());
  } catch (...) {
    return false;
  }
  return true;
}

// The Python exception for a failed future: a Python handler's own exception (the same
// object, with a note naming each particle it passed through), else push.ParticleError
// or push.CancelledError with the runtime's one-line message.
[[noreturn]] void raise_python(std::exception_ptr error) {
  std::string notes;
  std::exception_ptr cause = error;
  for (;;) {
    try {
      std::rethrow_exception(cause);
    } catch (const PythonError& e) {
      py::object exc = e.exception();
      if (py::hasattr(exc, "add_note") && !notes.empty()) {
        py::list existing = py::getattr(exc, "__notes__", py::list());
        if (!existing.contains(py::str(notes))) exc.attr("add_note")(notes);
      }
      // With its traceback, so that the handler's own frames come after the waiter's.
      PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr()));
      Py_INCREF(type);
      PyErr_Restore(type, exc.inc_ref().ptr(), PyException_GetTraceback(exc.ptr()));
      throw py::error_already_set();
    } catch (const ParticleError& e) {
      notes += (notes.empty() ? "" : "\n") + std::string("in push particle ") + std::to_string(e.pid()) +
               ", message '" + e.message_name() + "'";
      if (!e.cause()) break;
      cause = e.cause();
    } catch (...) {
      break;
    }
  }
  if (!set_push_error(error)) {
    try {
      std::rethrow_exception(error);
    } catch (const py::error_already_set&) {
      throw;
    } catch (const std::exception& e) {
      PyErr_SetString(particle_error_type.ptr(), e.what());
    }
  }
  throw py::error_already_set();
}

// A future as Python holds it: with the handler whose send or get made it, so that a
// thread that handler started waits through the handler's fiber too (the lane is the
// handler's while it runs, and the result may need that lane).
template <class T>
struct Waitable {
  Future<T> future;
  std::weak_ptr<HandlerCall> call;
};

// Waits for `future`. On a handler's thread the handler's fiber waits (suspended, so its lane
// runs other particles meanwhile); elsewhere this thread waits with the GIL released, a
// slice at a time so that Ctrl-C (a signal the main thread handles) raises
// KeyboardInterrupt here. `timeout` in seconds; None waits for ever.
template <class T>
T wait_future(const Waitable<T>& w, std::optional<double> timeout) {
  const Future<T>& future = w.future;
  using clock = std::chrono::steady_clock;
  if (timeout && !(*timeout >= 0)) throw py::value_error("push: a timeout is a number of seconds >= 0");
  // Beyond a year is for ever (and keeps the deadline's arithmetic from overflowing).
  if (timeout && *timeout > 3.2e7) timeout.reset();
  const auto limit = timeout ? std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(*timeout))
                             : clock::duration::max();
  HandlerCall* via = HandlerCall::current();
  std::shared_ptr<HandlerCall> maker;
  if (via == nullptr) {
    maker = w.call.lock();
    if (maker && maker->active()) via = maker.get();
  }
  if (via != nullptr) {
    try {
      return via->on_lane<T>([&](Particle&) {
        if (timeout && !future.wait_for(limit)) throw WaitTimeout("push: the future is not ready within the timeout");
        return future.wait();
      });
    } catch (const HandlerEnded&) {
      // The maker's handler ended meanwhile: its lane is free, wait here. A handler's own
      // thread cannot get here (its handler runs while it waits).
      if (via == HandlerCall::current()) raise_python(std::current_exception());
    } catch (const py::error_already_set&) {
      throw;
    } catch (...) {
      raise_python(std::current_exception());
    }
  }
  const auto deadline = timeout ? clock::now() + limit : clock::time_point::max();
  for (;;) {
    bool ready;
    {
      py::gil_scoped_release unlocked;
      ready = future.wait_for(std::chrono::milliseconds(50));
    }
    if (ready) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (clock::now() >= deadline) throw WaitTimeout("push: the future is not ready within the timeout");
  }
  if (future.has_error()) raise_python(future.error());
  return future.wait();
}

}  // namespace

PYBIND11_MODULE(_push, m) {
  m.doc() = "push's runtime for Python (see the push package)";
  py::module_::import("torch");
  particle_error_type =
      PyErr_NewExceptionWithDoc("push.ParticleError", "A particle's handler failed; the message names the particle.",
                                PyExc_RuntimeError, nullptr);
  cancelled_error_type = PyErr_NewExceptionWithDoc(
      "push.CancelledError", "The distribution shut down before the result came.", PyExc_RuntimeError, nullptr);
  m.def(
      "mix_seed", [](const std::vector<uint64_t>& values) { return push::mix_seed(std::span<const uint64_t>(values)); },
      py::arg("values"), "push::mix_seed: a 64-bit seed from non-negative integers, in order");
  m.def("usable_cores", &push::usable_cores, "push::usable_cores: the cores this process may run on");
  m.attr("ParticleError") = particle_error_type;
  m.attr("CancelledError") = cancelled_error_type;
  py::register_exception_translator([](std::exception_ptr p) {
    // Anything else goes on to pybind11's own translators (std::exception: RuntimeError).
    if (p && !set_push_error(p)) std::rethrow_exception(p);
  });

  py::class_<Waitable<c10::IValue>>(m, "Future")
      .def(
          "wait",
          [](const Waitable<c10::IValue>& f, std::optional<double> timeout) {
            return to_python(wait_future(f, timeout));
          },
          py::arg("timeout") = py::none())
      .def("done", [](const Waitable<c10::IValue>& f) { return f.future.is_ready(); });

  py::class_<ParticleView>(m, "View")
      .def_property_readonly("pid", &ParticleView::pid)
      .def_property_readonly("version", &ParticleView::version)
      .def_property_readonly("names", &ParticleView::names)
      .def_property_readonly("parameters", &ParticleView::parameters)
      .def_property_readonly("gradients", [](const ParticleView& v) {
        py::list out;
        for (const auto& g : v.gradients()) out.append(g.defined() ? py::cast(g) : py::none());
        return out;
      });

  py::class_<Waitable<ParticleView>>(m, "ViewFuture")
      .def(
          "wait",
          [](const Waitable<ParticleView>& f, std::optional<double> timeout) { return wait_future(f, timeout); },
          py::arg("timeout") = py::none())
      .def("done", [](const Waitable<ParticleView>& f) { return f.future.is_ready(); });

  py::class_<HandlerCall, std::shared_ptr<HandlerCall>>(m, "HandlerCall")
      .def_property_readonly("pid", &HandlerCall::pid)
      .def_property_readonly("message", &HandlerCall::message)
      .def_property_readonly("active", &HandlerCall::active)
      .def("send",
           // Carried by the handler's fiber, on the lane: the lane takes the message in the
           // handler's order with its other work, so a lane's schedule repeats run to run. Sent
           // straight from the handler's thread (as p_launch sends), a message entered the lane
           // at a moment that varies: one eviction more or fewer between two equal runs, and no
           // measurable gain on workload W (docs/python.md).
           [](const std::shared_ptr<HandlerCall>& call, Pid to, const std::string& message, const py::args& args) {
             Args values = to_ivalues(args);
             PFuture f = call->on_lane<PFuture>([&](Particle& p) { return p.send(to, message, std::move(values)); });
             return Waitable<c10::IValue>{std::move(f), call};
           })
      .def("get", [](const std::shared_ptr<HandlerCall>& call, Pid pid) {
        Future<ParticleView> f = call->on_lane<Future<ParticleView>>([&](Particle& p) { return p.get(pid); });
        return Waitable<ParticleView>{std::move(f), call};
      });

  bind_world(m);
  py::class_<Distribution>(m, "Distribution")
      .def(py::init([](py::object mk_module, py::object dispatch, std::optional<int> devices,
                       std::optional<std::string> device_type, int cache_size, int view_size, uint64_t seed,
                       std::optional<dist::World> world, std::optional<int> intra_op_threads) {
             PushOptions options;
             options.devices(devices).cache_size(cache_size).view_size(view_size).seed(seed).world(world);
             if (intra_op_threads && *intra_op_threads < 1) {
               throw py::value_error("push: intra_op_threads must be >= 1, got " + std::to_string(*intra_op_threads));
             }
             options.intra_op_threads(intra_op_threads);
             if (device_type) {
               if (*device_type == "cpu") {
                 options.device_type(torch::kCPU);
               } else if (*device_type == "cuda") {
                 options.device_type(torch::kCUDA);
               } else {
                 throw py::value_error("push: device_type must be 'cpu' or 'cuda', got '" + *device_type + "'");
               }
             }
             return std::make_unique<Distribution>(std::move(mk_module), std::move(dispatch), options);
           }),
           py::arg("mk_module"), py::arg("dispatch"), py::arg("devices") = py::none(),
           py::arg("device_type") = py::none(), py::arg("cache_size"), py::arg("view_size"), py::arg("seed"),
           py::arg("world") = py::none(), py::arg("intra_op_threads") = py::none())
      .def("create", &Distribution::create, py::arg("receive"), py::arg("device") = py::none(),
           py::arg("rank") = py::none())
      .def("rank", [](const Distribution& d) { return d.query<int>([](Push& p) { return p.rank(); }); })
      .def("world_size", [](const Distribution& d) { return d.query<int>([](Push& p) { return p.world_size(); }); })
      .def("rank_of",
           [](const Distribution& d, Pid pid) { return d.query<int>([&](Push& p) { return p.rank_of(pid); }); })
      .def("launch",
           [](Distribution& d, Pid pid, const std::string& message, const py::args& args) {
             return Waitable<c10::IValue>{d.launch(pid, message, args), {}};
           })
      .def("register_receive",
           [](Distribution& d, HandlerCall& call, const std::string& message, py::object fn) {
             Handler h = d.handler(message, std::move(fn));
             call.on_lane<int>([&](Particle& p) {
               p.register_receive(message, h);
               return 0;
             });
           })
      .def("particle_ids",
           [](const Distribution& d) { return d.query<std::vector<Pid>>([](Push& p) { return p.particle_ids(); }); })
      .def("parameters",
           [](Distribution& d, Pid pid) {
             return d.run<std::vector<torch::Tensor>>([&](Push& p) { return p.p_parameters(pid); });
           })
      .def("named_parameters",
           [](Distribution& d, Pid pid) {
             return d.run<std::vector<std::pair<std::string, torch::Tensor>>>(
                 [&](Push& p) { return p.p_named_parameters(pid); });
           })
      .def("num_devices", [](const Distribution& d) { return d.query<int>([](Push& p) { return p.num_devices(); }); })
      .def("device", [](const Distribution& d,
                        int lane) { return d.query<std::string>([&](Push& p) { return p.device(lane).str(); }); })
      .def("cache_stats",
           [](const Distribution& d, int lane) {
             const CacheStats c = d.query<CacheStats>([&](Push& p) { return p.cache_stats(lane); });
             return std::map<std::string, int64_t>{{"resident", c.resident},
                                                   {"evictions", c.evictions},
                                                   {"restores", c.restores},
                                                   {"view_hits", c.view_hits},
                                                   {"view_misses", c.view_misses}};
           })
      .def("lane_of",
           [](const Distribution& d, Pid pid) { return d.query<int>([&](Push& p) { return p.lane_of(pid); }); })
      .def(
          "save",
          [](Distribution& d, const std::string& dir, std::optional<std::vector<Pid>> pids) {
            d.run([&](Push& p) {
              if (pids) {
                p.save(dir, *pids);
              } else {
                p.save(dir);
              }
            });
          },
          py::arg("dir"), py::arg("pids") = py::none())
      .def("barrier", [](Distribution& d) { d.run([](Push& p) { p.barrier(); }); })
      .def("load", [](Distribution& d, const std::string& dir) { d.run([&](Push& p) { p.load(dir); }); })
      .def("load_particles",
           [](Distribution& d, const std::string& dir) {
             return d.run<std::vector<Pid>>([&](Push& p) { return p.load_particles(dir); });
           })
      .def("handler_threads", &Distribution::handler_threads)
      .def_property_readonly("closed", &Distribution::closed)
      .def_static("in_handler", [] { return HandlerCall::current() != nullptr; })
      .def("close", &Distribution::close, py::call_guard<py::gil_scoped_release>())
      .def("close_later", &Distribution::close_later, py::call_guard<py::gil_scoped_release>())
      .def("wait_stopped", &Distribution::wait_stopped, py::arg("seconds"), py::call_guard<py::gil_scoped_release>())
      .def_static("join_closers", &Distribution::join_closers, py::call_guard<py::gil_scoped_release>());

  bind_bayes(m);
}
