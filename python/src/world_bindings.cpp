#include "world_bindings.h"

#include "without_gil.h"

#include <push/dist/world.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace py = pybind11;

namespace push::python {

namespace {

// Seconds from Python as milliseconds, rounded up: from 1 ms to about 115 days.
std::chrono::milliseconds seconds(double s, const char* name) {
  if (!(s >= 0.001 && s <= 1e7)) {
    throw py::value_error(c10::str("push.dist: ", name, " must be a number of seconds from 0.001 to 1e7, got ", s));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::optional<std::string>(v) : std::nullopt;
}

}  // namespace

void bind_world(py::module_& m) {
  // Leaving the job waits for the other ranks to leave (rank 0 hosts the store): without
  // the GIL.
  py::class_<dist::World, WithoutGil<dist::World>>(m, "World")
      // Joining blocks until every rank has come (or init_timeout): without the GIL, so
      // that the interpreter's other threads run meanwhile.
      .def(py::init([](std::optional<int> rank, std::optional<int> world_size, std::optional<std::string> master_addr,
                       std::optional<int> master_port, std::optional<int> local_rank,
                       std::optional<std::string> job_secret, std::optional<std::string> job_id,
                       std::optional<double> init_timeout, std::optional<double> timeout,
                       std::optional<double> rpc_timeout) {
             // What the launcher set, then what the caller gave: a plain `World()` under
             // torchrun or push launch joins their job; without a launcher, rank and
             // world_size must be given.
             const bool launched = dist::WorldOptions::launched_rank().has_value();
             dist::WorldOptions o;
             try {
               if (launched) o = dist::WorldOptions::from_env();
             } catch (const std::exception& e) {
               throw py::value_error(e.what());
             }
             if (!launched && (!rank || !world_size)) {
               throw py::value_error(c10::str("push.dist.World: no launcher set RANK",
                                              env("WORLD_SIZE") ? "" : " and WORLD_SIZE",
                                              " (torchrun, push launch, mpirun, srun): give rank= and world_size="));
             }
             if (!launched) {
               // By hand: the store's address from the environment when it is there, as
               // torch.distributed reads it; what the caller gives wins.
               if (auto a = env("MASTER_ADDR")) o.master_addr(*a);
               if (auto p = env("MASTER_PORT")) {
                 char* end = nullptr;
                 const long port = std::strtol(p->c_str(), &end, 10);
                 if (*end != '\0' || port < 1 || port > 65535) {
                   throw py::value_error("push.dist.World: MASTER_PORT must be a port number, got '" + *p + "'");
                 }
                 o.master_port(static_cast<int>(port));
               }
               if (auto secret = env("PUSH_JOB_SECRET")) o.job_secret(*secret);
             }
             if (rank) o.rank(*rank);
             if (world_size) o.world_size(*world_size);
             if (master_addr) o.master_addr(*master_addr);
             if (master_port) o.master_port(*master_port);
             if (local_rank) o.local_rank(*local_rank);
             if (job_secret) o.job_secret(*job_secret);
             if (job_id) o.job_id(*job_id);
             if (init_timeout) o.init_timeout(seconds(*init_timeout, "init_timeout"));
             if (timeout) o.timeout(seconds(*timeout, "timeout"));
             if (rpc_timeout) o.rpc_timeout(seconds(*rpc_timeout, "rpc_timeout"));
             try {
               o.validate();
             } catch (const std::exception& e) {
               throw py::value_error(e.what());
             }
             py::gil_scoped_release unlocked;
             return WithoutGil<dist::World>(new dist::World(std::move(o)));
           }),
           py::kw_only(), py::arg("rank") = py::none(), py::arg("world_size") = py::none(),
           py::arg("master_addr") = py::none(), py::arg("master_port") = py::none(), py::arg("local_rank") = py::none(),
           py::arg("job_secret") = py::none(), py::arg("job_id") = py::none(), py::arg("init_timeout") = py::none(),
           py::arg("timeout") = py::none(), py::arg("rpc_timeout") = py::none())
      .def_property_readonly("rank", &dist::World::rank)
      .def_property_readonly("size", &dist::World::size)
      .def_property_readonly("local_rank", &dist::World::local_rank)
      .def_property_readonly("name", &dist::World::name)
      .def(
          "barrier",
          [](const dist::World& w, std::optional<double> timeout) {
            std::optional<std::chrono::milliseconds> t;
            if (timeout) t = seconds(*timeout, "timeout");
            py::gil_scoped_release unlocked;
            w.barrier(t);
          },
          py::arg("timeout") = py::none());
}

}  // namespace push::python
