// Stacking optimizer state in and out of a FusedStack; see fused_optimizer.h.
#include "fused_optimizer.h"

#include <push/core/errors.h>
#include <push/detail/torch_compat.h>

namespace push::bayes {
namespace {

using namespace torch::optim;
constexpr const char* kOrigin = "push::bayes::FusedStack";

// The tensors and step counter of a per-parameter state, for the optimizers LibTorch ships.
struct Fields {
  std::vector<torch::Tensor*> tensors;
  int64_t* step = nullptr;
};

Fields fields_of(OptimizerParamState& s) {
  if (auto* a = dynamic_cast<AdamParamState*>(&s)) return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}, &a->step()};
  if (auto* a = dynamic_cast<AdamWParamState*>(&s)) return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}, &a->step()};
  if (auto* a = dynamic_cast<SGDParamState*>(&s)) return {{&a->momentum_buffer()}, nullptr};
  if (auto* a = dynamic_cast<RMSpropParamState*>(&s)) return {{&a->square_avg(), &a->momentum_buffer(), &a->grad_avg()}, &a->step()};
  if (auto* a = dynamic_cast<AdagradParamState*>(&s)) return {{&a->sum()}, &a->step()};
  PUSH_CHECK(false, kOrigin, "only Adam, AdamW, SGD, RMSprop and Adagrad are fused");
  return {};
}

template <class O>
bool equal_as(const OptimizerOptions& a, const OptimizerOptions& b) {
  const auto* x = dynamic_cast<const O*>(&a);
  const auto* y = dynamic_cast<const O*>(&b);
  return x != nullptr && y != nullptr && *x == *y;
}

bool same_options(const OptimizerOptions& a, const OptimizerOptions& b) {
  return equal_as<AdamOptions>(a, b) || equal_as<AdamWOptions>(a, b) || equal_as<SGDOptions>(a, b) ||
         equal_as<RMSpropOptions>(a, b) || equal_as<AdagradOptions>(a, b);
}

}  // namespace

void check_fusable(const Optimizer& optimizer) {
  PUSH_CHECK(optimizer.param_groups().size() == 1, kOrigin, "an optimizer with ",
             optimizer.param_groups().size(), " parameter groups is not fused");
  const auto& options = optimizer.param_groups()[0].options();
  PUSH_CHECK(same_options(options, options), kOrigin,
             "only Adam, AdamW, SGD, RMSprop and Adagrad are fused (their updates are element-wise)");
}

FusedOptimizer::FusedOptimizer(std::vector<Optimizer*> members, std::vector<std::vector<torch::Tensor>> member_params,
                               std::vector<torch::Tensor> stacks, const OptimizerFactory& make_optimizer)
    : members_(std::move(members)), member_params_(std::move(member_params)), stacks_(std::move(stacks)) {
  PUSH_CHECK(make_optimizer != nullptr, kOrigin, "the members have optimizers but no factory was given");
  const size_t n = members_.size();
  for (size_t i = 0; i < n; ++i) {
    PUSH_CHECK(members_[i] != nullptr && members_[i]->param_groups().size() == 1, kOrigin, "member ", i,
               " has no optimizer or more than one parameter group");
    PUSH_CHECK(same_options(members_[i]->param_groups()[0].options(), members_[0]->param_groups()[0].options()),
               kOrigin, "the optimizer options of member ", i, " differ from member 0's (or are of a kind not fused)");
  }
  fused_ = make_optimizer(stacks_);
  PUSH_CHECK(fused_ != nullptr && fused_->param_groups().size() == 1, kOrigin,
             "the optimizer factory made no optimizer or more than one parameter group");
  fused_->param_groups()[0].set_options(members_[0]->param_groups()[0].options().clone());
  torch::NoGradGuard no_grad;
  auto& fused_state = fused_->state();
  for (size_t k = 0; k < stacks_.size(); ++k) {
    const auto key = compat::optimizer_state_key(stacks_[k]);
    std::vector<OptimizerParamState*> states;
    for (size_t i = 0; i < n; ++i) {
      auto& state = members_[i]->state();
      auto it = state.find(compat::optimizer_state_key(member_params_[i][k]));
      if (it != state.end()) states.push_back(it->second.get());
    }
    if (states.empty()) {
      fused_state.erase(key);
      continue;
    }
    PUSH_CHECK(states.size() == n, kOrigin, "parameter ", k, " has optimizer state in ", states.size(), " of ", n,
               " members");
    auto stacked = states[0]->clone();
    Fields out = fields_of(*stacked);
    std::vector<Fields> in;
    for (auto* s : states) in.push_back(fields_of(*s));
    if (out.step != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        PUSH_CHECK(*in[i].step == *in[0].step, kOrigin, "member ", i, " has taken ", *in[i].step,
                   " optimizer steps, member 0 ", *in[0].step);
      }
    }
    for (size_t j = 0; j < out.tensors.size(); ++j) {
      std::vector<torch::Tensor> slices;
      for (size_t i = 0; i < n; ++i) {
        const torch::Tensor& t = *in[i].tensors[j];
        if (t.defined() && t.numel() > 0) slices.push_back(t);
      }
      if (slices.empty()) continue;
      PUSH_CHECK(slices.size() == n, kOrigin, "optimizer state ", j, " of parameter ", k, " is set in ", slices.size(),
                 " of ", n, " members");
      *out.tensors[j] = torch::stack(slices);
    }
    fused_state[key] = std::move(stacked);
  }
}

void FusedOptimizer::write_back() {
  torch::NoGradGuard no_grad;
  auto& fused_state = fused_->state();
  for (size_t k = 0; k < stacks_.size(); ++k) {
    auto it = fused_state.find(compat::optimizer_state_key(stacks_[k]));
    if (it == fused_state.end()) continue;
    Fields from = fields_of(*it->second);
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& state = members_[i]->state();
      const auto key = compat::optimizer_state_key(member_params_[i][k]);
      auto mine = state.find(key);
      if (mine == state.end()) mine = state.emplace(key, it->second->clone()).first;
      Fields to = fields_of(*mine->second);
      for (size_t j = 0; j < from.tensors.size(); ++j) {
        const torch::Tensor& all = *from.tensors[j];
        if (!all.defined() || all.numel() == 0) continue;
        torch::Tensor& t = *to.tensors[j];
        auto slice = all[static_cast<int64_t>(i)];
        if (t.defined() && t.sizes() == slice.sizes() && !t.is_same(all)) {
          t.copy_(slice);
        } else {
          t = slice.clone();
        }
      }
      if (from.step != nullptr) *to.step = *from.step;
    }
  }
}

}  // namespace push::bayes
