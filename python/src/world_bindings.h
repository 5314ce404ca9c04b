#pragma once
// push._push.World: a job of several processes (push::dist::World) for Python
// (python/push/dist.py).
#include <pybind11/pybind11.h>

namespace push::python {

void bind_world(pybind11::module_& parent);

}  // namespace push::python
