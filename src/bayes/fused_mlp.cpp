// A fused stack of Linear layers and activations on the CPU, forward and backward written
// out over the BLAS LibTorch calls; see fused_mlp.h.
#include "fused_mlp.h"

#include <push/core/errors.h>

#include <ATen/ops/mm_ops.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <climits>

namespace push::bayes::detail {
namespace {

using fused_plan::Kind;
using Layer = StackedMlp::Layer;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void activate_(torch::Tensor& z, const Layer& l) {
  switch (l.activation) {
    case Kind::relu:
      z.relu_();
      break;
    case Kind::leaky_relu:
      torch::leaky_relu_(z, l.slope);
      break;
    case Kind::tanh:
      z.tanh_();
      break;
    case Kind::sigmoid:
      z.sigmoid_();
      break;
    default:
      break;
  }
}

// The gradient before the activation from the one after it, through the activation's
// output (what autograd saves for ReLU, Tanh and Sigmoid; for LeakyReLU with a slope >= 0
// the output's sign is the input's).
torch::Tensor activation_backward(const torch::Tensor& g, const torch::Tensor& out, const Layer& l) {
  switch (l.activation) {
    case Kind::relu:
      return torch::threshold_backward(g, out, 0);
    case Kind::leaky_relu:
      return torch::leaky_relu_backward(g, out, l.slope, /*self_is_result=*/true);
    case Kind::tanh:
      return torch::tanh_backward(g, out);
    case Kind::sigmoid:
      return torch::sigmoid_backward(g, out);
    default:
      return g;
  }
}

// Layer l of a plan as StackedMlp::of encodes it for the node (saved_data holds IValues):
// weight, bias and activation kind at 3 l .. 3 l + 2 of `ints`, the slope at l of `slopes`.
Layer layer_at(const c10::List<int64_t>& ints, const c10::List<double>& slopes, size_t l) {
  return Layer{ints.get(3 * l), ints.get(3 * l + 1), static_cast<Kind>(ints.get(3 * l + 2)), slopes.get(l)};
}

struct MlpFunction : torch::autograd::Function<MlpFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, at::TensorList stacks,
                               const std::vector<Layer>* layers, const c10::IValue* ints, const c10::IValue* slopes) {
    const int64_t n = input.size(0), b = input.size(1);
    variable_list saved{input.contiguous()};
    saved.insert(saved.end(), stacks.begin(), stacks.end());
    torch::Tensor h = saved.front();
    for (const Layer& l : *layers) {
      const auto& w = stacks[l.weight];  // [n, out, in]
      const int64_t out = w.size(1), in = w.size(2);
      // Seeded with a copy of the bias, then beta = 1: what Linear's addmm computes for each
      // member. (With one point the expanded bias is already contiguous: contiguous() would
      // hand back the bias itself, and the product would overwrite it.)
      torch::Tensor z = torch::empty({n, b, out}, input.options());
      if (l.bias >= 0) z.copy_(stacks[l.bias].unsqueeze(1).expand({n, b, out}));
      gemm_each(n, false, true, b, out, in, h, w, l.bias >= 0 ? 1.0F : 0.0F, z);
      activate_(z, l);
      saved.push_back(z);
      h = z;
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["plan"] = *ints;  // shared, not copied: encoded once per stack
    ctx->saved_data["slopes"] = *slopes;
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The products below fill buffers through raw pointers: nothing of them is recorded.
    PUSH_CHECK(!at::GradMode::is_enabled(), "push::bayes::FusedStack",
               "the fused CPU path of a Linear stack has no second derivative (backward with create_graph); "
               "differentiate the members one by one");
    const auto ints = ctx->saved_data["plan"].toIntList();
    const auto slopes = ctx->saved_data["slopes"].toDoubleList();
    const auto saved = ctx->get_saved_variables();
    const size_t layers = slopes.size(), count = saved.size() - 1 - layers;  // input, stacks, outputs
    const torch::Tensor& input = saved[0];
    auto stack = [&](int64_t k) -> const torch::Tensor& { return saved[1 + static_cast<size_t>(k)]; };
    auto output = [&](size_t l) -> const torch::Tensor& { return saved[1 + count + l]; };
    const int64_t n = input.size(0), b = input.size(1);
    variable_list result(1 + count + 3);          // the input, each stack, the plan's 3 arguments (none)
    auto add = [&](int64_t k, torch::Tensor g) {  // a stack two layers share gets both terms
      auto& slot = result[1 + static_cast<size_t>(k)];
      slot = slot.defined() ? slot + g : std::move(g);
    };
    torch::Tensor g = grads[0];
    for (size_t l = layers; l-- > 0;) {
      const Layer layer = layer_at(ints, slopes, l);
      g = activation_backward(g, output(l), layer).contiguous();
      const torch::Tensor& w = stack(layer.weight);
      const torch::Tensor& h = l > 0 ? output(l - 1) : input;
      const int64_t out = w.size(1), in = w.size(2);
      auto dw = torch::empty_like(w);
      gemm_each(n, true, false, out, in, b, g, h, 0.0F, dw);
      add(layer.weight, std::move(dw));
      if (layer.bias >= 0) add(layer.bias, g.sum(1));
      if (l == 0 && !ctx->needs_input_grad(0)) break;
      auto dh = torch::empty({n, b, in}, g.options());
      gemm_each(n, false, false, b, in, out, g, w, 0.0F, dh);
      g = std::move(dh);
      if (l == 0) result[0] = g;
    }
    return result;
  }
};

bool fits_int(const torch::Tensor& t) {
  for (int64_t d : t.sizes()) {
    if (d <= 0 || d > INT_MAX) return false;
  }
  return true;
}

}  // namespace

// The sgemm_ of the library that holds at::mm, searched from that library: a global lookup
// would miss it where LibTorch was loaded privately (Python loads extensions RTLD_LOCAL),
// and could find another BLAS than the one at::mm calls.
Sgemm blas_sgemm() {
  static const Sgemm sgemm = []() -> Sgemm {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&at::_ops::mm::call), &info) == 0 || info.dli_fname == nullptr) return nullptr;
    void* lib = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return nullptr;
    auto* found = reinterpret_cast<Sgemm>(::dlsym(lib, "sgemm_"));
    ::dlclose(lib);  // the reference RTLD_NOLOAD took; LibTorch keeps the library loaded
    return found;
  }();
  return sgemm;
}

// The column-major call computes C^T = op(B)^T op(A)^T.
void gemm_each(int64_t count, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const torch::Tensor& a,
               const torch::Tensor& b, float beta, const torch::Tensor& c) {
  const Sgemm sgemm = blas_sgemm();
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n), ldc = N;
  const float one = 1;
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* pc = c.data_ptr<float>();
  for (int64_t i = 0; i < count; ++i) {
    sgemm(tb ? "T" : "N", ta ? "T" : "N", &N, &M, &K, &one, pb + i * n * k, &ldb, pa + i * m * k, &lda, &beta,
          pc + i * m * n, &ldc);
  }
}

std::optional<StackedMlp> StackedMlp::of(const std::vector<fused_plan::Op>& ops) {
  if (blas_sgemm() == nullptr) return std::nullopt;
  StackedMlp mlp;
  for (const auto& op : ops) {
    switch (op.kind) {
      case Kind::linear:
        mlp.layers_.push_back(Layer{op.weight, op.bias, Kind::identity, 0});
        break;
      case Kind::leaky_relu:
      case Kind::relu:
      case Kind::tanh:
      case Kind::sigmoid:
        if (mlp.layers_.empty() || mlp.layers_.back().activation != Kind::identity) return std::nullopt;
        if (op.kind == Kind::leaky_relu && op.slope < 0) return std::nullopt;
        mlp.layers_.back().activation = op.kind;
        mlp.layers_.back().slope = op.slope;
        break;
      case Kind::identity:
      case Kind::flatten:  // of [N, B, features]: nothing to do
        break;
      case Kind::dropout:
        if (op.p != 0) return std::nullopt;
        break;
      default:
        return std::nullopt;
    }
  }
  if (mlp.layers_.empty()) return std::nullopt;
  c10::List<int64_t> ints;
  c10::List<double> slopes;
  for (const Layer& l : mlp.layers_) {
    for (int64_t v : {l.weight, l.bias, static_cast<int64_t>(l.activation)}) ints.push_back(v);
    slopes.push_back(l.slope);
  }
  mlp.ints_ = ints;
  mlp.slopes_ = slopes;
  return mlp;
}

bool StackedMlp::takes(const torch::Tensor& x, const std::vector<torch::Tensor>& stacks) const {
  auto plain = [&](const torch::Tensor& t) {
    return t.layout() == torch::kStrided && t.scalar_type() == torch::kFloat && t.device().is_cpu() && fits_int(t) &&
           t.size(0) == x.size(0);
  };
  if (x.dim() != 3 || !plain(x)) return false;
  for (const auto& s : stacks) {
    if (!plain(s) || !s.is_contiguous()) return false;
  }
  // Each layer's shapes chain: where they do not, the general path names the mismatch.
  int64_t features = x.size(2);
  for (const Layer& l : layers_) {
    const auto& w = stacks[l.weight];
    if (w.dim() != 3 || w.size(2) != features) return false;
    features = w.size(1);
    if (l.bias >= 0 && (stacks[l.bias].dim() != 2 || stacks[l.bias].size(1) != features)) return false;
  }
  return true;
}

torch::Tensor StackedMlp::forward(const torch::Tensor& x, const std::vector<torch::Tensor>& stacks) const {
  return MlpFunction::apply(x, at::TensorList(stacks), &layers_, &ints_, &slopes_);
}

}  // namespace push::bayes::detail
