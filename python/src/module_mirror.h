#pragma once
// A Python torch.nn.Module as push's runtime sees it: a C++ module with the same tree of
// submodules, parameters and buffers, holding the very same tensors.
//
// The runtime moves, swaps, copies into views, saves and loads a particle through its C++
// module; since the tensors are shared (a C++ tensor and the Python Parameter are one
// TensorImpl), all of that is what the Python module sees. Its forward is Python code: the
// Python particle runs it on a handler thread, never on a lane.
#include <torch/nn/module.h>

#include <pybind11/pybind11.h>

namespace push::python {

class ModuleMirrorImpl : public torch::nn::Module {
 public:
  /// With the GIL held. Throws TypeError when `module` is not a torch.nn.Module.
  explicit ModuleMirrorImpl(pybind11::handle module);
  /// Throws: a Python module's forward runs from Python (particle.forward in a handler).
  torch::Tensor forward(torch::Tensor x);
};
TORCH_MODULE(ModuleMirror);

}  // namespace push::python
