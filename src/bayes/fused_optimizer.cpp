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
                               std::vector<torch::Tensor> stacks, std::vector<int64_t> offsets, torch::Tensor flat,
                               const OptimizerFactory& make_optimizer)
    : members_(std::move(members)),
      member_params_(std::move(member_params)),
      stacks_(std::move(stacks)),
      offsets_(std::move(offsets)),
      flat_(std::move(flat)) {
  PUSH_CHECK(make_optimizer != nullptr, kOrigin, "the members have optimizers but no factory was given");
  const size_t n = members_.size();
  for (size_t i = 0; i < n; ++i) {
    PUSH_CHECK(members_[i] != nullptr && members_[i]->param_groups().size() == 1, kOrigin, "member ", i,
               " has no optimizer or more than one parameter group");
    PUSH_CHECK(same_options(members_[i]->param_groups()[0].options(), members_[0]->param_groups()[0].options()),
               kOrigin, "the optimizer options of member ", i, " differ from member 0's (or are of a kind not fused)");
  }
  fused_ = make_optimizer({flat_});
  PUSH_CHECK(fused_ != nullptr && fused_->param_groups().size() == 1, kOrigin,
             "the optimizer factory made no optimizer or more than one parameter group");
  fused_->param_groups()[0].set_options(members_[0]->param_groups()[0].options().clone());
  torch::NoGradGuard no_grad;
  // Every member's state of every parameter, or none at all (a fresh optimizer).
  std::vector<std::vector<OptimizerParamState*>> states(stacks_.size());  // [k][i]
  size_t found = 0;
  for (size_t k = 0; k < stacks_.size(); ++k) {
    for (size_t i = 0; i < n; ++i) {
      auto& state = members_[i]->state();
      auto it = state.find(compat::optimizer_state_key(member_params_[i][k]));
      states[k].push_back(it == state.end() ? nullptr : it->second.get());
      found += it != state.end();
    }
  }
  if (found == 0) return;
  PUSH_CHECK(found == n * stacks_.size(), kOrigin, "optimizer state exists for ", found, " of the ",
             n * stacks_.size(), " parameters of the members (all or none fuse)");
  auto stacked = states[0][0]->clone();
  Fields out = fields_of(*stacked);
  const int64_t step = out.step != nullptr ? *out.step : 0;
  std::vector<std::vector<Fields>> in(stacks_.size());  // [k][i]
  for (size_t k = 0; k < stacks_.size(); ++k) {
    for (size_t i = 0; i < n; ++i) {
      in[k].push_back(fields_of(*states[k][i]));
      if (in[k][i].step != nullptr) {
        PUSH_CHECK(*in[k][i].step == step, kOrigin, "member ", i, " has taken ", *in[k][i].step,
                   " optimizer steps on parameter ", k, ", member 0 ", step, " on parameter 0");
      }
    }
  }
  for (size_t j = 0; j < out.tensors.size(); ++j) {
    std::vector<torch::Tensor> parts;  // in the buffer's layout
    size_t set = 0;
    for (size_t k = 0; k < stacks_.size(); ++k) {
      std::vector<torch::Tensor> slices;
      for (size_t i = 0; i < n; ++i) {
        const torch::Tensor& t = *in[k][i].tensors[j];
        if (t.defined() && t.numel() > 0) slices.push_back(t.reshape(-1));
      }
      set += slices.size();
      if (!slices.empty()) parts.push_back(torch::stack(slices).reshape(-1));
    }
    if (set == 0) continue;
    PUSH_CHECK(set == n * stacks_.size(), kOrigin, "optimizer state ", j, " is set for ", set, " of the ",
               n * stacks_.size(), " parameters of the members");
    *out.tensors[j] = torch::cat(parts);
  }
  fused_->state()[compat::optimizer_state_key(flat_)] = std::move(stacked);
}

void FusedOptimizer::write_back() {
  torch::NoGradGuard no_grad;
  auto& fused_state = fused_->state();
  auto it = fused_state.find(compat::optimizer_state_key(flat_));
  if (it == fused_state.end()) return;
  Fields from = fields_of(*it->second);
  for (size_t k = 0; k < stacks_.size(); ++k) {
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& state = members_[i]->state();
      const auto key = compat::optimizer_state_key(member_params_[i][k]);
      auto mine = state.find(key);
      if (mine == state.end()) mine = state.emplace(key, it->second->clone()).first;
      Fields to = fields_of(*mine->second);
      for (size_t j = 0; j < from.tensors.size(); ++j) {
        const torch::Tensor& all = *from.tensors[j];
        if (!all.defined() || all.numel() == 0) continue;
        auto slice = all.narrow(0, offsets_[k], stacks_[k].numel()).view(stacks_[k].sizes())[static_cast<int64_t>(i)];
        torch::Tensor& t = *to.tensors[j];
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
