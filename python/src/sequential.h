#pragma once
// A Python torch.nn.Sequential of standard layers rebuilt as the C++ module that computes the
// same function, with the same weights: what lets push.bayes train a Python model fused and
// without the GIL.
//
// Rebuilt: Linear, Conv2d (zero padding), MaxPool2d, AvgPool2d, BatchNorm1d/2d, Flatten,
// Dropout (as push::bayes::Dropout, which draws from the particle's own generator),
// Identity, ReLU, LeakyReLU, ELU, GELU, SiLU, Softplus, Tanh, Sigmoid, and Sequentials of
// them. Exactly these classes: a subclass may compute something else.
#include <torch/nn/modules/container/sequential.h>

#include <pybind11/pybind11.h>

#include <string>

namespace push::python {

/// Why `module` cannot be rebuilt in C++ (a sentence naming the layer), or "" when it can.
/// With the GIL held.
std::string rebuild_blocker(pybind11::handle module);

/// The C++ rebuild of `module`; throws ValueError with rebuild_blocker()'s reason.
torch::nn::Sequential rebuild_sequential(pybind11::handle module);

}  // namespace push::python
