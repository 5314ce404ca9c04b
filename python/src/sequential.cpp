#include "sequential.h"

#include <push/bayes/mc_dropout.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/nn.h>

#include <functional>
#include <map>
#include <vector>

namespace py = pybind11;
namespace nn = torch::nn;

namespace push::python {
namespace {

using Build = std::function<void(py::handle layer, nn::Sequential& into, torch::Dtype dtype)>;

template <class T>
T attr(py::handle o, const char* name) {
  return o.attr(name).cast<T>();
}

std::vector<int64_t> pair_of(py::handle o, const char* name) {
  py::object v = o.attr(name);
  if (py::isinstance<py::int_>(v)) return {v.cast<int64_t>(), v.cast<int64_t>()};
  return v.cast<std::vector<int64_t>>();
}

torch::Tensor tensor_of(py::handle o, const char* name) {
  py::object v = o.attr(name);
  return v.is_none() ? torch::Tensor() : THPVariable_Unpack(v.ptr());
}

// Copies `from` into the C++ module's own tensor (no shared storage: the C++ particles
// train their copies; the Python module stays as it was).
void copy_into(torch::Tensor& to, const torch::Tensor& from) {
  torch::NoGradGuard no_grad;
  if (from.defined()) to.copy_(from);
}

std::string type_name(py::handle o) {
  py::handle t = py::type::handle_of(o);
  return py::str(t.attr("__module__")).cast<std::string>() + "." + py::str(t.attr("__qualname__")).cast<std::string>();
}

// The rebuilt layers by class (the exact class, looked up in torch.nn), and what in their
// configuration has no C++ equivalent.
struct Layer {
  std::function<std::string(py::handle)> blocker;  // "" when this configuration rebuilds
  Build build;
};

const std::map<std::string, Layer>& layers() {
  static const auto* table = new std::map<std::string, Layer>{
      {"Linear",
       {[](py::handle) { return std::string(); },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          nn::Linear m(nn::LinearOptions(attr<int64_t>(l, "in_features"), attr<int64_t>(l, "out_features"))
                           .bias(!l.attr("bias").is_none()));
          m->to(dtype);
          copy_into(m->weight, tensor_of(l, "weight"));
          if (m->bias.defined()) copy_into(m->bias, tensor_of(l, "bias"));
          s->push_back(m);
        }}},
      {"Conv2d",
       {[](py::handle l) {
          if (attr<std::string>(l, "padding_mode") != "zeros") return std::string("its padding_mode is not 'zeros'");
          if (py::isinstance<py::str>(l.attr("padding"))) return std::string("its padding is a string");
          return std::string();
        },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          const auto k = pair_of(l, "kernel_size");
          nn::Conv2d m(
              nn::Conv2dOptions(attr<int64_t>(l, "in_channels"), attr<int64_t>(l, "out_channels"), {k[0], k[1]})
                  .stride(torch::ExpandingArray<2>(pair_of(l, "stride")))
                  .padding(torch::ExpandingArray<2>(pair_of(l, "padding")))
                  .dilation(torch::ExpandingArray<2>(pair_of(l, "dilation")))
                  .groups(attr<int64_t>(l, "groups"))
                  .bias(!l.attr("bias").is_none()));
          m->to(dtype);
          copy_into(m->weight, tensor_of(l, "weight"));
          if (m->bias.defined()) copy_into(m->bias, tensor_of(l, "bias"));
          s->push_back(m);
        }}},
      {"MaxPool2d",
       {[](py::handle l) {
          return attr<bool>(l, "return_indices") ? std::string("it returns indices") : std::string();
        },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          py::object stride = l.attr("stride");
          auto k = pair_of(l, "kernel_size");
          nn::MaxPool2dOptions o({k[0], k[1]});
          if (!stride.is_none()) o.stride(torch::ExpandingArray<2>(pair_of(l, "stride")));
          o.padding(torch::ExpandingArray<2>(pair_of(l, "padding")))
              .dilation(torch::ExpandingArray<2>(pair_of(l, "dilation")))
              .ceil_mode(attr<bool>(l, "ceil_mode"));
          s->push_back(nn::MaxPool2d(o));
        }}},
      {"AvgPool2d",
       {[](py::handle l) {
          return l.attr("divisor_override").is_none() ? std::string() : std::string("it has a divisor_override");
        },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          py::object stride = l.attr("stride");
          auto k = pair_of(l, "kernel_size");
          nn::AvgPool2dOptions o({k[0], k[1]});
          if (!stride.is_none()) o.stride(torch::ExpandingArray<2>(pair_of(l, "stride")));
          o.padding(torch::ExpandingArray<2>(pair_of(l, "padding")))
              .ceil_mode(attr<bool>(l, "ceil_mode"))
              .count_include_pad(attr<bool>(l, "count_include_pad"));
          s->push_back(nn::AvgPool2d(o));
        }}},
      {"Flatten",
       {[](py::handle) { return std::string(); },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          s->push_back(nn::Flatten(
              nn::FlattenOptions().start_dim(attr<int64_t>(l, "start_dim")).end_dim(attr<int64_t>(l, "end_dim"))));
        }}},
      {"Dropout",
       {[](py::handle l) {
          const double p = attr<double>(l, "p");
          return p >= 0 && p < 1 ? std::string() : "its p is " + std::to_string(p) + ", not in [0, 1)";
        },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          s->push_back(bayes::Dropout(attr<double>(l, "p")));
        }}},
      {"Identity",
       {[](py::handle) { return std::string(); },
        [](py::handle, nn::Sequential& s, torch::Dtype) { s->push_back(nn::Identity()); }}},
      {"ReLU",
       {[](py::handle) { return std::string(); },
        [](py::handle, nn::Sequential& s, torch::Dtype) { s->push_back(nn::ReLU()); }}},
      {"Tanh",
       {[](py::handle) { return std::string(); },
        [](py::handle, nn::Sequential& s, torch::Dtype) { s->push_back(nn::Tanh()); }}},
      {"Sigmoid",
       {[](py::handle) { return std::string(); },
        [](py::handle, nn::Sequential& s, torch::Dtype) { s->push_back(nn::Sigmoid()); }}},
      {"SiLU",
       {[](py::handle) { return std::string(); },
        [](py::handle, nn::Sequential& s, torch::Dtype) { s->push_back(nn::SiLU()); }}},
      {"LeakyReLU",
       {[](py::handle) { return std::string(); },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          s->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(attr<double>(l, "negative_slope"))));
        }}},
      {"ELU",
       {[](py::handle) { return std::string(); },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          s->push_back(nn::ELU(nn::ELUOptions().alpha(attr<double>(l, "alpha"))));
        }}},
      {"GELU",
       {[](py::handle l) {
          const auto a = py::hasattr(l, "approximate") ? attr<std::string>(l, "approximate") : std::string("none");
          return a == "none" ? std::string() : std::string("its approximate is '" + a + "'");
        },
        [](py::handle, nn::Sequential& s, torch::Dtype) { s->push_back(nn::GELU()); }}},
      {"Softplus",
       {[](py::handle) { return std::string(); },
        [](py::handle l, nn::Sequential& s, torch::Dtype dtype) {
          s->push_back(nn::Softplus(
              nn::SoftplusOptions().beta(attr<double>(l, "beta")).threshold(attr<double>(l, "threshold"))));
        }}},
  };
  return *table;
}

template <class BatchNorm, class Options>
void build_batch_norm(py::handle l, nn::Sequential& s, torch::Dtype dtype) {
  Options o(attr<int64_t>(l, "num_features"));
  o.eps(attr<double>(l, "eps"))
      .momentum(attr<double>(l, "momentum"))
      .affine(attr<bool>(l, "affine"))
      .track_running_stats(attr<bool>(l, "track_running_stats"));
  BatchNorm m(o);
  m->to(dtype);
  if (m->weight.defined()) copy_into(m->weight, tensor_of(l, "weight"));
  if (m->bias.defined()) copy_into(m->bias, tensor_of(l, "bias"));
  if (m->running_mean.defined()) copy_into(m->running_mean, tensor_of(l, "running_mean"));
  if (m->running_var.defined()) copy_into(m->running_var, tensor_of(l, "running_var"));
  if (m->num_batches_tracked.defined()) {
    // to(dtype) converted the counter too: it stays an integer, as in torch.
    m->num_batches_tracked.set_data(m->num_batches_tracked.to(torch::kLong));
    copy_into(m->num_batches_tracked, tensor_of(l, "num_batches_tracked"));
  }
  s->push_back(m);
}

std::string batch_norm_blocker(py::handle l) {
  return l.attr("momentum").is_none() ? std::string("its momentum is None (a cumulative average)") : std::string();
}

// The class name of `layer` when it is exactly torch.nn's class of that name, else "".
std::string torch_class(py::handle layer) {
  static py::handle nn_module = py::module_::import("torch.nn").release();
  const std::string name = py::str(py::type::handle_of(layer).attr("__name__"));
  if (!py::hasattr(nn_module, name.c_str())) return "";
  return nn_module.attr(name.c_str()).ptr() == py::type::handle_of(layer).ptr() ? name : "";
}

std::string blocker_of(py::handle layer, const std::string& where) {
  const std::string name = torch_class(layer);
  if (name == "Sequential") {
    int i = 0;
    for (py::handle child : layer) {
      std::string why = blocker_of(child, where + "[" + std::to_string(i++) + "]");
      if (!why.empty()) return why;
    }
    return "";
  }
  if (name == "BatchNorm1d" || name == "BatchNorm2d") {
    const std::string why = batch_norm_blocker(layer);
    return why.empty() ? "" : where + " (" + name + "): " + why;
  }
  auto it = layers().find(name);
  if (it == layers().end()) return where + " is a " + type_name(layer) + ", which push does not rebuild in C++";
  const std::string why = it->second.blocker(layer);
  return why.empty() ? "" : where + " (" + name + "): " + why;
}

void build(py::handle layer, nn::Sequential& into, torch::Dtype dtype) {
  const std::string name = torch_class(layer);
  if (name == "Sequential") {
    for (py::handle child : layer) build(child, into, dtype);
  } else if (name == "BatchNorm1d") {
    build_batch_norm<nn::BatchNorm1d, nn::BatchNorm1dOptions>(layer, into, dtype);
  } else if (name == "BatchNorm2d") {
    build_batch_norm<nn::BatchNorm2d, nn::BatchNorm2dOptions>(layer, into, dtype);
  } else {
    layers().at(name).build(layer, into, dtype);
  }
}

}  // namespace

std::string rebuild_blocker(py::handle module) {
  if (torch_class(module) != "Sequential") {
    return "the model is a " + type_name(module) + ", not a torch.nn.Sequential";
  }
  return blocker_of(module, "layer");
}

nn::Sequential rebuild_sequential(py::handle module) {
  const std::string why = rebuild_blocker(module);
  if (!why.empty()) throw py::value_error("push: cannot rebuild the model in C++: " + why);
  // The Python module's dtype (its first parameter's): C++ layers start float32, and are
  // converted before the weights are copied in, so nothing is rounded on the way.
  torch::Dtype dtype = torch::kFloat32;
  for (auto p : py::reinterpret_borrow<py::iterable>(module.attr("parameters")())) {
    dtype = THPVariable_Unpack(p.ptr()).scalar_type();
    break;
  }
  nn::Sequential seq;
  build(module, seq, dtype);
  return seq;
}

}  // namespace push::python
