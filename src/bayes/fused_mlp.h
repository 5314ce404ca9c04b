#pragma once
// The CPU path of a fused stack of Linear layers and element-wise activations: forward and
// backward written out, one BLAS call per member and matrix product, in one autograd node.
//
// Through autograd, forward and backward of workload W's stack took 1.8x the time of its
// matrix products alone (949 against 539 us a step, 1.13, a scratch program; 1.3x written
// out): for each product a dispatched bmm that splits into N dispatched mm calls, a node
// and its saved tensors per operation, every gradient accumulated into the stacks' buffer
// by a separate add. Here the products call the BLAS LibTorch's own mm calls (results equal
// to float rounding; W's gradients came out bit for bit equal on 1.13), the activations
// run in place, and the bias gradients are one reduction per layer.
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "fused_plan.h"

namespace push::bayes::detail {

/// Fortran BLAS sgemm: column-major, arguments by pointer, 32-bit sizes (LibTorch's CPU
/// builds call the LP64 interface: Debian's OpenBLAS, the wheels' MKL).
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);

/// The sgemm_ that LibTorch's own at::mm calls, or nullptr (a build without BLAS).
Sgemm blas_sgemm();

/// Row-major c[i] = beta c[i] + op(a[i]) op(b[i]) for each of `count` members (consecutive
/// blocks of each float32 operand; op(a) is m x k, transposed where ta, likewise b): one
/// blas_sgemm() call per member, nothing else.
void gemm_each(int64_t count, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const torch::Tensor& a,
               const torch::Tensor& b, float beta, const torch::Tensor& c);

class StackedMlp {
 public:
  /// The plan as a chain of Linear layers, each followed by at most one activation (ReLU,
  /// LeakyReLU with a slope >= 0, Tanh, Sigmoid; Identity, Flatten and Dropout(0) are no
  /// layers here), or nullopt: another layer, or no BLAS to call.
  static std::optional<StackedMlp> of(const std::vector<fused_plan::Op>& ops);

  /// Whether x [N, B, in] and the stacks can take this path: float32, on the CPU.
  bool takes(const torch::Tensor& x, const std::vector<torch::Tensor>& stacks) const;

  /// The stack's output [N, B, out], differentiable in x and in the stacks.
  torch::Tensor forward(const torch::Tensor& x, const std::vector<torch::Tensor>& stacks) const;

  struct Layer {
    int64_t weight = -1, bias = -1;  // indices among the stacks; bias -1: none
    fused_plan::Kind activation = fused_plan::Kind::identity;
    double slope = 0;
  };

 private:
  std::vector<Layer> layers_;
  c10::IValue ints_, slopes_;  // layers_ as the autograd node keeps it (fused_mlp.cpp, layer_at)
};

}  // namespace push::bayes::detail
