// Stacking optimizer state in and out of a FusedStack; see fused_optimizer.h.
#include "fused_optimizer.h"

#include <push/core/errors.h>
#include "core/torch_compat.h"

#include <cstring>

namespace push::bayes {
namespace {

using namespace torch::optim;
constexpr const char* kFusedStack = "push::bayes::FusedStack";

// The tensors and step counter of a per-parameter state, for the optimizers LibTorch ships.
struct Fields {
  std::vector<torch::Tensor*> tensors;
  int64_t* step = nullptr;
};

Fields fields_of(OptimizerParamState& s) {
  if (auto* a = dynamic_cast<AdamParamState*>(&s))
    return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}, &a->step()};
  if (auto* a = dynamic_cast<AdamWParamState*>(&s))
    return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}, &a->step()};
  if (auto* a = dynamic_cast<SGDParamState*>(&s)) return {{&a->momentum_buffer()}, nullptr};
  if (auto* a = dynamic_cast<RMSpropParamState*>(&s))
    return {{&a->square_avg(), &a->momentum_buffer(), &a->grad_avg()}, &a->step()};
  if (auto* a = dynamic_cast<AdagradParamState*>(&s)) return {{&a->sum()}, &a->step()};
  PUSH_CHECK(false, kFusedStack, "only Adam, AdamW, SGD, RMSprop and Adagrad are fused");
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
  PUSH_CHECK(optimizer.param_groups().size() == 1, kFusedStack, "an optimizer with ", optimizer.param_groups().size(),
             " parameter groups is not fused");
  const auto& options = optimizer.param_groups()[0].options();
  PUSH_CHECK(same_options(options, options), kFusedStack,
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
  PUSH_CHECK(make_optimizer != nullptr, kFusedStack, "the members have optimizers but no factory was given");
  const size_t n = members_.size();
  for (size_t i = 0; i < n; ++i) {
    PUSH_CHECK(members_[i] != nullptr && members_[i]->param_groups().size() == 1, kFusedStack, "member ", i,
               " has no optimizer or more than one parameter group");
    PUSH_CHECK(same_options(members_[i]->param_groups()[0].options(), members_[0]->param_groups()[0].options()),
               kFusedStack, "the optimizer options of member ", i,
               " differ from member 0's (or are of a kind not fused)");
  }
  fused_ = make_optimizer({flat_});
  PUSH_CHECK(fused_ != nullptr && fused_->param_groups().size() == 1, kFusedStack,
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
  PUSH_CHECK(found == n * stacks_.size(), kFusedStack, "optimizer state exists for ", found, " of the ",
             n * stacks_.size(), " parameters of the members (all or none fuse)");
  auto stacked = states[0][0]->clone();
  Fields out = fields_of(*stacked);
  const int64_t step = out.step != nullptr ? *out.step : 0;
  std::vector<std::vector<Fields>> in(stacks_.size());  // [k][i]
  for (size_t k = 0; k < stacks_.size(); ++k) {
    for (size_t i = 0; i < n; ++i) {
      in[k].push_back(fields_of(*states[k][i]));
      if (in[k][i].step != nullptr) {
        PUSH_CHECK(*in[k][i].step == step, kFusedStack, "member ", i, " has taken ", *in[k][i].step,
                   " optimizer steps on parameter ", k, ", member 0 ", step, " on parameter 0");
      }
    }
  }
  for (size_t j = 0; j < out.tensors.size(); ++j) {
    size_t set = 0;
    for (size_t k = 0; k < stacks_.size(); ++k) {
      for (size_t i = 0; i < n; ++i) {
        const torch::Tensor& t = *in[k][i].tensors[j];
        set += t.defined() && t.numel() > 0;
      }
    }
    if (set == 0) continue;
    PUSH_CHECK(set == n * stacks_.size(), kFusedStack, "optimizer state ", j, " is set for ", set, " of the ",
               n * stacks_.size(), " parameters of the members");
    // In the buffer's layout: parameter k's stack from offsets[k].
    auto all = torch::empty({flat_.numel()}, in[0][0].tensors[j]->options());
    for (size_t k = 0; k < stacks_.size(); ++k) {
      std::vector<torch::Tensor> parts;
      for (size_t i = 0; i < n; ++i) parts.push_back(*in[k][i].tensors[j]);
      detail::stack_into(parts, all.narrow(0, offsets_[k], stacks_[k].numel()).view(stacks_[k].sizes()));
    }
    *out.tensors[j] = all;
  }
  fused_->state()[compat::optimizer_state_key(flat_)] = std::move(stacked);
}

namespace detail {
namespace {
// Whether row i of `stack` and parts[i] can be copied as raw bytes, for every i.
bool raw_rows(const torch::Tensor& stack, const std::vector<torch::Tensor>& parts) {
  const int64_t n = static_cast<int64_t>(parts.size());
  if (!stack.device().is_cpu() || !stack.is_contiguous() || stack.dim() == 0 || stack.size(0) != n) return false;
  const int64_t row = n > 0 ? stack.numel() / n : 0;
  for (const auto& t : parts) {
    if (!t.device().is_cpu() || !t.is_contiguous() || t.scalar_type() != stack.scalar_type() || t.numel() != row) {
      return false;
    }
  }
  return true;
}
}  // namespace

void unstack_into(const torch::Tensor& stack, const std::vector<torch::Tensor>& parts) {
  const int64_t n = static_cast<int64_t>(parts.size());
  if (!raw_rows(stack, parts)) {
    for (int64_t i = 0; i < n; ++i) parts[i].copy_(stack[i]);
    return;
  }
  const auto bytes = static_cast<size_t>(stack.numel() / std::max<int64_t>(n, 1)) * stack.element_size();
  const auto* from = static_cast<const char*>(stack.data_ptr());
  for (int64_t i = 0; i < n; ++i) std::memcpy(parts[i].data_ptr(), from + static_cast<size_t>(i) * bytes, bytes);
}

void stack_into(const std::vector<torch::Tensor>& parts, const torch::Tensor& stack) {
  const int64_t n = static_cast<int64_t>(parts.size());
  if (!raw_rows(stack, parts)) {
    for (int64_t i = 0; i < n; ++i) stack[i].copy_(parts[i].reshape(stack.sizes().slice(1)));
    return;
  }
  const auto bytes = static_cast<size_t>(stack.numel() / std::max<int64_t>(n, 1)) * stack.element_size();
  auto* to = static_cast<char*>(stack.data_ptr());
  for (int64_t i = 0; i < n; ++i) std::memcpy(to + static_cast<size_t>(i) * bytes, parts[i].data_ptr(), bytes);
}
}  // namespace detail

void FusedOptimizer::write_back() {
  torch::NoGradGuard no_grad;
  auto& fused_state = fused_->state();
  auto it = fused_state.find(compat::optimizer_state_key(flat_));
  if (it == fused_state.end()) return;
  Fields from = fields_of(*it->second);
  for (size_t k = 0; k < stacks_.size(); ++k) {
    std::vector<Fields> to;  // each member's state of parameter k
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& state = members_[i]->state();
      const auto key = compat::optimizer_state_key(member_params_[i][k]);
      auto mine = state.find(key);
      if (mine == state.end()) mine = state.emplace(key, it->second->clone()).first;
      to.push_back(fields_of(*mine->second));
      if (from.step != nullptr) *to.back().step = *from.step;
    }
    for (size_t j = 0; j < from.tensors.size(); ++j) {
      const torch::Tensor& all = *from.tensors[j];
      if (!all.defined() || all.numel() == 0) continue;
      auto stack = all.narrow(0, offsets_[k], stacks_[k].numel()).view(stacks_[k].sizes());
      std::vector<torch::Tensor> parts;
      for (auto& f : to) {
        torch::Tensor& t = *f.tensors[j];
        // A fresh tensor where the member has none of the row's shape, or shares the
        // fused buffer (a clone of the fused state): never a view into `all`.
        if (!t.defined() || t.sizes() != stack.sizes().slice(1) || t.is_same(all) ||
            (t.has_storage() && all.has_storage() && t.storage().is_alias_of(all.storage()))) {
          t = torch::empty(stack.sizes().slice(1), all.options());
        }
        parts.push_back(t);
      }
      detail::unstack_into(stack, parts);
    }
  }
}

}  // namespace push::bayes
