#pragma once
// push._push.bayes: the C++ Bayesian algorithms for Python (python/push/bayes/).
#include <pybind11/pybind11.h>

namespace push::python {

void bind_bayes(pybind11::module_& parent);

}  // namespace push::python
