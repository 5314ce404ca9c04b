#include "values.h"

#include <torch/csrc/autograd/python_variable.h>

namespace py = pybind11;

namespace push::python {

namespace {

// A Python object carried by reference inside an IValue. push's own rather than torch's
// (torch::jit's holder calls into symbols the 2.x wheels do not export): it only carries
// the object, and releases it under the GIL.
class PyObjectRef final : public c10::ivalue::PyObjectHolder {
 public:
  explicit PyObjectRef(py::object object) : object_(std::move(object)) {}
  ~PyObjectRef() override {
    py::gil_scoped_acquire gil;
    object_ = py::object();
  }
  PyObject* getPyObject() override { return object_.ptr(); }
  c10::InferredType tryToInferType() override {
    return c10::InferredType("push carries Python objects by reference, without a TorchScript type");
  }
  c10::IValue toIValue(const c10::TypePtr&, c10::optional<int32_t>) override {
    throw std::runtime_error("push: a Python object carried by reference has no TorchScript value");
  }
  std::string toStr() override {
    py::gil_scoped_acquire gil;
    return py::str(object_).cast<std::string>();
  }
  std::vector<at::Tensor> extractTensors() override { return {}; }

 private:
  py::object object_;
};

// Containers nest through the C++ stack: Python's own recursion limit bounds them, so a
// self-containing or absurdly deep list raises RecursionError instead of crashing.
struct Nesting {
  Nesting() {
    if (Py_EnterRecursiveCall(" while converting a push message value") != 0) throw py::error_already_set();
  }
  ~Nesting() { Py_LeaveRecursiveCall(); }
};

}  // namespace

c10::IValue to_ivalue(py::handle object) {
  if (object.is_none()) return {};
  if (THPVariable_Check(object.ptr())) return THPVariable_Unpack(object.ptr());
  // bool before int: Python's bool is an int.
  if (py::isinstance<py::bool_>(object)) return object.cast<bool>();
  if (py::isinstance<py::int_>(object)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(object.ptr(), &overflow);
    if (overflow == 0) return static_cast<int64_t>(v);
  } else if (py::isinstance<py::float_>(object)) {
    return object.cast<double>();
  } else if (py::isinstance<py::str>(object)) {
    return object.cast<std::string>();
  } else if (py::isinstance<py::tuple>(object)) {
    Nesting nesting;
    std::vector<c10::IValue> items;
    for (py::handle item : object) items.push_back(to_ivalue(item));
    return c10::ivalue::Tuple::create(std::move(items));
  } else if (PyList_CheckExact(object.ptr())) {
    Nesting nesting;
    c10::impl::GenericList list(c10::AnyType::get());
    for (py::handle item : object) list.push_back(to_ivalue(item));
    return list;
  } else if (PyDict_CheckExact(object.ptr())) {
    // Only str keys keep a dict a dict; other keys travel as the dict object itself.
    bool str_keys = true;
    for (auto item : py::reinterpret_borrow<py::dict>(object))
      str_keys = str_keys && py::isinstance<py::str>(item.first);
    if (str_keys) {
      Nesting nesting;
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (auto item : py::reinterpret_borrow<py::dict>(object)) {
        dict.insert(item.first.cast<std::string>(), to_ivalue(item.second));
      }
      return dict;
    }
  }
  c10::intrusive_ptr<c10::ivalue::PyObjectHolder> held =
      c10::make_intrusive<PyObjectRef>(py::reinterpret_borrow<py::object>(object));
  return c10::IValue(std::move(held));
}

std::vector<c10::IValue> to_ivalues(const py::args& args) {
  std::vector<c10::IValue> values;
  values.reserve(args.size());
  for (py::handle a : args) values.push_back(to_ivalue(a));
  return values;
}

py::object to_python(const c10::IValue& value) {
  if (value.isNone()) return py::none();
  if (value.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(value.toTensor()));
  if (value.isBool()) return py::bool_(value.toBool());
  if (value.isInt()) return py::int_(value.toInt());
  if (value.isDouble()) return py::float_(value.toDouble());
  if (value.isString()) return py::str(value.toStringRef());
  if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    py::tuple out(items.size());
    for (size_t i = 0; i < items.size(); ++i) out[i] = to_python(items[i]);
    return out;
  }
  if (value.isList()) {
    py::list out;
    for (const c10::IValue& item : value.toListRef()) out.append(to_python(item));
    return out;
  }
  if (value.isGenericDict()) {
    py::dict out;
    for (const auto& item : value.toGenericDict()) out[to_python(item.key())] = to_python(item.value());
    return out;
  }
  if (value.isPyObject()) return py::reinterpret_borrow<py::object>(value.toPyObject());
  if (value.isDevice()) return py::str(value.toDevice().str());
  throw py::type_error("push: a " + value.tagKind() + " value has no Python form here");
}

py::tuple to_python(const std::vector<c10::IValue>& values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = to_python(values[i]);
  return out;
}

}  // namespace push::python
