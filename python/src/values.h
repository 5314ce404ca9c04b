#pragma once
// Python objects <-> c10::IValue, for message arguments and results. Call with the GIL held.
//
// Tensors cross as the same tensor (no copy); None, bool, int, float and str as themselves;
// tuples, lists and dicts element by element. Anything else (a user's object, a module) is
// carried by reference inside the IValue, so it reaches a handler in this process as the
// same object; such a value cannot go to another rank.
#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace push::python {

c10::IValue to_ivalue(pybind11::handle object);
std::vector<c10::IValue> to_ivalues(const pybind11::args& args);
pybind11::object to_python(const c10::IValue& value);
pybind11::tuple to_python(const std::vector<c10::IValue>& values);

}  // namespace push::python
