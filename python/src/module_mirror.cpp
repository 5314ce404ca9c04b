#include "module_mirror.h"

#include <push/core/errors.h>

#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <string>

namespace py = pybind11;

namespace push::python {
namespace {

void mirror(py::handle from, torch::nn::Module& to) {
  for (auto item : py::reinterpret_borrow<py::dict>(from.attr("_parameters"))) {
    if (item.second.is_none()) continue;
    const torch::Tensor t = THPVariable_Unpack(item.second.ptr());
    to.register_parameter(item.first.cast<std::string>(), t, t.requires_grad());
  }
  for (auto item : py::reinterpret_borrow<py::dict>(from.attr("_buffers"))) {
    if (item.second.is_none()) continue;
    to.register_buffer(item.first.cast<std::string>(), THPVariable_Unpack(item.second.ptr()));
  }
  for (auto item : py::reinterpret_borrow<py::dict>(from.attr("_modules"))) {
    if (item.second.is_none()) continue;
    auto child = std::make_shared<torch::nn::Module>(py::str(py::type::handle_of(item.second).attr("__name__")));
    mirror(item.second, *child);
    to.register_module(item.first.cast<std::string>(), child);
  }
}

}  // namespace

ModuleMirrorImpl::ModuleMirrorImpl(py::handle module)
    : torch::nn::Module(py::str(py::type::handle_of(module).attr("__name__")).cast<std::string>()) {
  const py::object nn_module = py::module_::import("torch.nn").attr("Module");
  if (!py::isinstance(module, nn_module)) {
    throw py::type_error(c10::str("push: the module factory must return a torch.nn.Module, got ",
                                  py::str(py::type::handle_of(module).attr("__name__")).cast<std::string>()));
  }
  mirror(module, *this);
}

torch::Tensor ModuleMirrorImpl::forward(torch::Tensor) {
  throw Error("[push.python] a Python module's forward runs in Python: call particle.forward from a Python handler");
}

}  // namespace push::python
