// FusedStack: the layer plan of a fusable network and its batched forward; see fused.h.
// The optimizer state's copies in and out are in fused_optimizer.cpp.
#include <push/bayes/fused.h>
#include <push/bayes/mc_dropout.h>
#include <push/core/errors.h>
#include "core/torch_compat.h"

#include <c10/util/StringUtil.h>

#include <typeinfo>
#include <unordered_map>

#include "fused_mlp.h"
#include "fused_optimizer.h"
#include "fused_plan.h"
#include "learned_noise.h"

namespace push::bayes {
namespace nn = torch::nn;

namespace {

namespace F = torch::nn::functional;
using fused_plan::Kind;
using fused_plan::Op;

// The Sequential of a network: under the learned-noise wrapper (set in *wrapper) and the
// runtime's SequentialNet (how a factory's Sequential becomes an AnyModule).
nn::Module* network_of(nn::Module& module, nn::Module** wrapper) {
  *wrapper = nullptr;
  nn::Module* net = &module;
  if (dynamic_cast<detail::LearnedNoiseImpl*>(net) != nullptr) {
    *wrapper = net;
    for (const auto& child : net->named_children()) {
      if (child.key() == "net") net = child.value().get();
    }
  }
  if (auto* wrapped = dynamic_cast<SequentialNetImpl*>(net)) net = wrapped->layers().get();
  return net;
}

// The plan of one member without parameter indices; throws naming the first layer that
// cannot be fused.
std::vector<Op> describe(nn::Module& member, const torch::OrderedDict<std::string, torch::Tensor>& named) {
  const char* origin = "push::bayes::FusedStack";
  nn::Module* wrapper = nullptr;
  nn::Module* net = network_of(member, &wrapper);
  auto* seq = dynamic_cast<nn::SequentialImpl*>(net);
  PUSH_CHECK(seq != nullptr, origin, "only a torch::nn::Sequential is fused, not ", net->name());
  for (const auto& item : named) {
    PUSH_CHECK(item.value().requires_grad(), origin, "parameter '", item.key(),
               "' is frozen (requires_grad false): a stack trains all of them");
  }
  std::vector<Op> ops;
  int64_t i = 0;
  for (const auto& child : seq->children()) {
    Op op;
    nn::Module* m = child.get();
    // Named only in errors: a module's name() demangles its type, which a build that runs
    // every epoch should not pay for.
    const auto where = [m, l = i++] { return c10::str("layer ", l, " (", m->name(), ")"); };
    if (auto* lin = dynamic_cast<nn::LinearImpl*>(m)) {
      op.kind = Kind::linear;
      op.signature = c10::str("linear ", lin->weight.sizes(), lin->bias.defined());
    } else if (auto* conv = dynamic_cast<nn::Conv2dImpl*>(m)) {
      const auto& o = conv->options;
      PUSH_CHECK(o.groups() == 1, origin, where(), ": grouped convolutions are not fused");
      PUSH_CHECK(torch::enumtype::get_enum_name(o.padding_mode()) == "kZeros", origin, where(),
                 ": only zero padding is fused");
      op.kind = Kind::conv2d;
      op.conv = std::dynamic_pointer_cast<nn::Conv2dImpl>(child);
      op.signature = c10::str("conv2d ", conv->weight.sizes(), conv->bias.defined(), " ", o.stride(), o.dilation(),
                              torch::enumtype::get_enum_name(o.padding_mode()));
      if (const auto* pad = compat::explicit_padding<torch::ExpandingArray<2>>(o.padding())) {
        op.signature += c10::str(" ", *pad);
      } else {
        PUSH_CHECK(false, origin, where(), ": only explicit padding is fused");
      }
    } else if (auto* pool = dynamic_cast<nn::MaxPool2dImpl*>(m)) {
      const auto& o = pool->options;
      op.kind = Kind::maxpool2d;
      op.pool = std::dynamic_pointer_cast<nn::MaxPool2dImpl>(child);
      op.signature = c10::str("maxpool2d ", o.kernel_size(), o.stride(), o.padding(), o.dilation(), o.ceil_mode());
    } else if (auto* flat = dynamic_cast<nn::FlattenImpl*>(m)) {
      PUSH_CHECK(flat->options.start_dim() == 1 && flat->options.end_dim() == -1, origin, where(),
                 ": only Flatten from dimension 1 to the last is fused");
      op.kind = Kind::flatten;
      op.signature = "flatten";
    } else if (dynamic_cast<nn::ReLUImpl*>(m) != nullptr) {
      op.kind = Kind::relu;
      op.signature = "relu";
    } else if (auto* leaky = dynamic_cast<nn::LeakyReLUImpl*>(m)) {
      op.kind = Kind::leaky_relu;
      op.slope = leaky->options.negative_slope();
      op.signature = c10::str("leaky_relu ", op.slope);
    } else if (dynamic_cast<nn::TanhImpl*>(m) != nullptr) {
      op.kind = Kind::tanh;
      op.signature = "tanh";
    } else if (dynamic_cast<nn::SigmoidImpl*>(m) != nullptr) {
      op.kind = Kind::sigmoid;
      op.signature = "sigmoid";
    } else if (dynamic_cast<nn::IdentityImpl*>(m) != nullptr) {
      op.kind = Kind::identity;
      op.signature = "identity";
    } else if (auto* drop = dynamic_cast<DropoutImpl*>(m)) {
      op.kind = Kind::dropout;
      op.p = drop->p();
      op.dropouts.push_back(drop);
      op.signature = c10::str("dropout ", op.p);
    } else if (dynamic_cast<nn::DropoutImpl*>(m) != nullptr) {
      PUSH_CHECK(false, origin, where(),
                 ": torch::nn::Dropout draws from the global generator (masks would depend on scheduling); "
                 "use push::bayes::Dropout");
    } else {
      PUSH_CHECK(false, origin, where(), " is not a layer FusedStack knows");
    }
    PUSH_CHECK(m->buffers().empty() || op.kind == Kind::dropout, origin, where(),
               ": layers with buffers are not fused");
    ops.push_back(std::move(op));
  }
  if (wrapper != nullptr) PUSH_CHECK(wrapper->buffers().empty(), origin, "the learned-noise wrapper has buffers");
  return ops;
}

}  // namespace

std::string fusion_blocker(nn::Module& module, torch::optim::Optimizer* optimizer) {
  try {
    describe(module, module.named_parameters());
    if (optimizer != nullptr) check_fusable(*optimizer);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

struct FusedStack::Impl {
  int64_t n = 0;
  std::vector<Op> ops;
  int64_t log_precision = -1;  // learned-noise wrapper: its parameter's stack
  // Every stack is a view of `flat` (stack k at offsets[k]), its gradient a view of
  // `flat_grad`: the optimizer then steps one tensor instead of one per parameter (Adam's
  // step took 48 us instead of 90 for the 16 networks of W), in the same arithmetic.
  torch::Tensor flat, flat_grad;
  std::vector<int64_t> offsets;
  std::vector<torch::Tensor> stacks;
  std::vector<std::string> names;
  std::vector<std::vector<torch::Tensor>> member_params;  // [member][k]
  std::unique_ptr<FusedOptimizer> optimizer;
  std::optional<detail::StackedMlp> mlp;  // the written-out CPU path, where the plan allows it

  // Activations between layers: stacked [N, B, ...], or one tensor per member from a
  // convolution on (stacking image activations copies more than the fused convolution
  // saves: the stacked CNN ran at half the unfused speed); they are stacked at the first
  // layer that needs it, a Linear.
  struct Flow {
    torch::Tensor stacked;
    std::vector<torch::Tensor> parts;
    bool split() const { return !parts.empty(); }
    const torch::Tensor& whole() {
      if (split()) {
        stacked = torch::stack(parts);
        parts.clear();
      }
      return stacked;
    }
    std::vector<torch::Tensor>& each() {
      if (!split()) parts = stacked.unbind(0);  // its backward stacks the gradients once
      return parts;
    }
    template <class Fn>
    void map(Fn fn) {
      if (split()) {
        for (auto& t : parts) t = fn(t);
      } else {
        stacked = fn(stacked);
      }
    }
  };

  /// The view of flat_grad that is stack k's gradient (made once: a step reassigns them).
  const torch::Tensor& grad_view(size_t k) const { return grad_views[k]; }
  std::vector<torch::Tensor> grad_views;
  void sync_grads();

  void linear(const Op& op, Flow& f) const {
    auto h = f.whole();
    auto wt = stacks[op.weight].transpose(1, 2);
    if (h.dim() != 3) {
      // Leading dimensions between the member and the features, as Linear allows.
      auto sizes = h.sizes().vec();
      sizes.back() = wt.size(2);
      h = h.reshape({n, -1, h.size(-1)});
      f.stacked = (op.bias >= 0 ? torch::baddbmm(stacks[op.bias].unsqueeze(1), h, wt) : torch::bmm(h, wt)).view(sizes);
      return;
    }
    torch::Tensor bias = op.bias >= 0 ? stacks[op.bias].unsqueeze(1) : torch::Tensor();
    // Also for one input feature, where an element-wise outer product is a little faster
    // but rounds otherwise than the unfused addmm: after 20 epochs of push train's default
    // it was 1.2% from the unfused metrics, against 0.09% this way.
    f.stacked = bias.defined() ? torch::baddbmm(bias, h, wt) : torch::bmm(h, wt);
  }

  void conv2d(const Op& op, Flow& f) const {
    const auto& o = op.conv->options;
    auto weights = stacks[op.weight].unbind(0);
    std::vector<torch::Tensor> biases;
    if (op.bias >= 0) biases = stacks[op.bias].unbind(0);
    auto& parts = f.each();
    for (int64_t i = 0; i < n; ++i) {
      auto options = F::Conv2dFuncOptions().stride(o.stride()).padding(o.padding()).dilation(o.dilation());
      if (op.bias >= 0) options.bias(biases[i]);
      parts[i] = F::conv2d(parts[i], weights[i], options);
    }
  }

  void maxpool2d(const Op& op, Flow& f) const {
    if (f.split()) {
      f.map([&](const torch::Tensor& t) { return F::max_pool2d(t, op.pool->options); });
      return;
    }
    const auto& h = f.stacked;
    auto out = F::max_pool2d(h.reshape({n * h.size(1), h.size(2), h.size(3), h.size(4)}), op.pool->options);
    f.stacked = out.view({n, h.size(1), out.size(1), out.size(2), out.size(3)});
  }

  void flatten(Flow& f) const {
    if (f.split()) {
      f.map([](const torch::Tensor& t) { return t.flatten(1); });
    } else {
      f.stacked = f.stacked.flatten(2);
    }
  }

  void dropout(const Op& op, Flow& f) const {
    if (op.p == 0) return;
    if (f.split()) {
      for (int64_t i = 0; i < n; ++i) {
        auto& t = f.parts[i];
        t = t * op.dropouts[i]->next_mask(t.sizes(), t.options()).to(t.device()) / (1 - op.p);
      }
      return;
    }
    const auto& h = f.stacked;
    std::vector<torch::Tensor> masks;
    for (int64_t i = 0; i < n; ++i) masks.push_back(op.dropouts[i]->next_mask(h[i].sizes(), h.options()));
    f.stacked = h * torch::stack(masks).to(h.device()) / (1 - op.p);
  }

  // Layer by layer through autograd's operations: every plan, every device.
  torch::Tensor through_ops(const torch::Tensor& x) const {
    Flow f{x, {}};
    for (const Op& op : ops) {
      switch (op.kind) {
        case Kind::flatten:
          flatten(f);
          break;
        case Kind::linear:
          linear(op, f);
          break;
        case Kind::conv2d:
          conv2d(op, f);
          break;
        case Kind::maxpool2d:
          maxpool2d(op, f);
          break;
        case Kind::relu:
          f.map([](const torch::Tensor& t) { return torch::relu(t); });
          break;
        case Kind::leaky_relu:
          f.map([&](const torch::Tensor& t) { return torch::leaky_relu(t, op.slope); });
          break;
        case Kind::tanh:
          f.map([](const torch::Tensor& t) { return torch::tanh(t); });
          break;
        case Kind::sigmoid:
          f.map([](const torch::Tensor& t) { return torch::sigmoid(t); });
          break;
        case Kind::identity:
          break;
        case Kind::dropout:
          dropout(op, f);
          break;
      }
    }
    return f.whole();
  }
};

FusedStack::FusedStack(const std::vector<nn::Module*>& members, const std::vector<torch::optim::Optimizer*>& optimizers,
                       const OptimizerFactory& make_optimizer)
    : impl_(std::make_unique<Impl>()) {
  const char* origin = "push::bayes::FusedStack";
  PUSH_CHECK(!members.empty(), origin, "no members");
  PUSH_CHECK(optimizers.empty() || optimizers.size() == members.size(), origin, members.size(), " members but ",
             optimizers.size(), " optimizers");
  Impl& s = *impl_;
  s.n = static_cast<int64_t>(members.size());
  const auto named0 = members[0]->named_parameters();
  s.ops = describe(*members[0], named0);
  // Every member: the same plan, the same parameter names and shapes.
  for (size_t i = 1; i < members.size(); ++i) {
    auto named = members[i]->named_parameters();
    auto ops = describe(*members[i], named);
    PUSH_CHECK(ops.size() == s.ops.size(), origin, "member ", i, " has ", ops.size(), " layers, member 0 has ",
               s.ops.size());
    for (size_t l = 0; l < ops.size(); ++l) {
      PUSH_CHECK(ops[l].signature == s.ops[l].signature, origin, "layer ", l, " of member ", i, " (", ops[l].signature,
                 ") differs from member 0's (", s.ops[l].signature, ")");
      if (ops[l].kind == Kind::dropout) s.ops[l].dropouts.push_back(ops[l].dropouts[0]);
    }
    PUSH_CHECK(named.size() == named0.size(), origin, "member ", i, " has ", named.size(), " parameters, member 0 has ",
               named0.size());
    for (size_t k = 0; k < named.size(); ++k) {
      PUSH_CHECK(named[k].key() == named0[k].key() && named[k]->sizes() == named0[k]->sizes() &&
                     named[k]->dtype() == named0[k]->dtype() && named[k]->device() == named0[k]->device(),
                 origin, "parameter ", k, " of member ", i, " (", named[k].key(), " ", named[k]->sizes(),
                 ") differs from member 0's (", named0[k].key(), " ", named0[k]->sizes(), ")");
    }
  }
  // The stacks, in parameter order; layers find theirs through member 0's tensors.
  std::unordered_map<const void*, int64_t> index;
  {
    torch::NoGradGuard no_grad;
    s.member_params.resize(members.size());
    for (size_t i = 0; i < members.size(); ++i) s.member_params[i] = members[i]->parameters();
    int64_t total = 0;
    for (size_t k = 0; k < named0.size(); ++k) {
      s.offsets.push_back(total);
      total += s.n * named0[k]->numel();
    }
    const auto options = named0.is_empty() ? torch::TensorOptions() : named0[0]->options();
    s.flat = torch::empty({total}, options.requires_grad(false));
    s.flat_grad = torch::zeros({total}, options.requires_grad(false));
    s.flat.mutable_grad() = s.flat_grad;  // what the optimizer steps on
    for (size_t k = 0; k < named0.size(); ++k) {
      std::vector<torch::Tensor> slices;
      for (size_t i = 0; i < members.size(); ++i) slices.push_back(s.member_params[i][k]);  // read, under no_grad
      std::vector<int64_t> shape{s.n};
      for (int64_t d : named0[k]->sizes()) shape.push_back(d);
      auto view = s.flat.narrow(0, s.offsets[k], s.n * named0[k]->numel()).view(shape);
      detail::stack_into(slices, view);
      s.stacks.push_back(view);
      s.names.push_back(named0[k].key());
      index[named0[k]->unsafeGetTensorImpl()] = static_cast<int64_t>(k);
      if (named0[k].key() == detail::kLogNoisePrecision) s.log_precision = static_cast<int64_t>(k);
    }
  }
  for (size_t k = 0; k < s.stacks.size(); ++k) {
    s.grad_views.push_back(s.flat_grad.narrow(0, s.offsets[k], s.stacks[k].numel()).view(s.stacks[k].sizes()));
    s.stacks[k].requires_grad_(true);
  }
  zero_grad();
  nn::Module* wrapper = nullptr;
  auto* seq = dynamic_cast<nn::SequentialImpl*>(network_of(*members[0], &wrapper));
  size_t l = 0;
  for (const auto& child : seq->children()) {
    Op& op = s.ops[l++];
    auto find = [&](const torch::Tensor& t) { return t.defined() ? index.at(t.unsafeGetTensorImpl()) : int64_t{-1}; };
    if (auto* lin = dynamic_cast<nn::LinearImpl*>(child.get())) {
      op.weight = find(lin->weight);
      op.bias = find(lin->bias);
    } else if (auto* conv = dynamic_cast<nn::Conv2dImpl*>(child.get())) {
      op.weight = find(conv->weight);
      op.bias = find(conv->bias);
    }
  }
  PUSH_CHECK(wrapper == nullptr || s.log_precision >= 0, origin, "the learned-noise wrapper has no ",
             detail::kLogNoisePrecision);
  s.mlp = detail::StackedMlp::of(s.ops);
  if (!optimizers.empty()) {
    s.optimizer =
        std::make_unique<FusedOptimizer>(optimizers, s.member_params, s.stacks, s.offsets, s.flat, make_optimizer);
  }
}

FusedStack::~FusedStack() = default;

int64_t FusedStack::size() const { return impl_->n; }
const std::vector<torch::Tensor>& FusedStack::parameters() const { return impl_->stacks; }
const std::vector<std::string>& FusedStack::parameter_names() const { return impl_->names; }

void FusedStack::Impl::sync_grads() {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < stacks.size(); ++k) {
    const auto& grad = stacks[k].grad();
    auto view = grad_view(k);
    if (grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes()) continue;
    // Replaced (an assigned direction, a gradient autograd stored itself): copied in.
    if (grad.defined()) {
      view.copy_(grad);
    } else {
      view.zero_();
    }
    stacks[k].mutable_grad() = view;
  }
}

void FusedStack::zero_grad() {
  Impl& s = *impl_;
  s.flat_grad.zero_();
  for (size_t k = 0; k < s.stacks.size(); ++k) s.stacks[k].mutable_grad() = s.grad_view(k);
}

void FusedStack::step() {
  Impl& s = *impl_;
  PUSH_CHECK(s.optimizer != nullptr, "push::bayes::FusedStack", "the members have no optimizer");
  s.sync_grads();
  s.optimizer->fused().step();
}

const torch::Tensor& FusedStack::flat_values() const { return impl_->flat; }

const torch::Tensor& FusedStack::flat_gradients() {
  impl_->sync_grads();
  return impl_->flat_grad;
}

std::pair<int64_t, int64_t> FusedStack::flat_range(size_t k) const {
  return {impl_->offsets.at(k), impl_->stacks.at(k).numel()};
}

torch::Tensor FusedStack::forward(const torch::Tensor& x) {
  const Impl& s = *impl_;
  PUSH_CHECK(x.dim() >= 2 && x.size(0) == s.n, "push::bayes::FusedStack::forward", "expected inputs [", s.n,
             ", B, ...], got ", x.sizes());
  torch::Tensor h = s.mlp && s.mlp->takes(x, s.stacks) ? s.mlp->forward(x, s.stacks) : s.through_ops(x);
  if (s.log_precision >= 0) {
    // The wrapper's forward: the means, then log γ over every target.
    auto log_gamma = s.stacks[s.log_precision].view({s.n, 1, -1}).expand({s.n, h.size(1), h.size(2)});
    h = torch::cat({h, log_gamma}, 2);
  }
  return h;
}

torch::Tensor FusedStack::flat_parameters() const {
  std::vector<torch::Tensor> flat;
  for (const auto& t : impl_->stacks) flat.push_back(t.detach().reshape({impl_->n, -1}));
  return torch::cat(flat, 1);
}

void FusedStack::write_back() {
  Impl& s = *impl_;
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < s.stacks.size(); ++k) {
    std::vector<torch::Tensor> params, grads;
    for (int64_t i = 0; i < s.n; ++i) params.push_back(s.member_params[i][k]);
    detail::unstack_into(s.stacks[k].detach(), params);
    const auto& grad = s.stacks[k].grad();
    if (!grad.defined()) continue;
    for (int64_t i = 0; i < s.n; ++i) {
      auto& param = s.member_params[i][k];
      if (!param.grad().defined() || param.grad().sizes() != param.sizes())
        param.mutable_grad() = torch::empty_like(param);
      grads.push_back(param.grad());
    }
    detail::unstack_into(grad, grads);
  }
  if (s.optimizer) s.optimizer->write_back();
}

}  // namespace push::bayes
