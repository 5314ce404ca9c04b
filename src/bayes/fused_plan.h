#pragma once
// The layer plan of a FusedStack (fused.cpp builds it from member 0's Sequential): what
// each layer is and which stacks hold its parameters. fused_mlp.cpp reads it too.
#include <push/bayes/mc_dropout.h>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace push::bayes::fused_plan {

enum class Kind { flatten, linear, conv2d, maxpool2d, relu, leaky_relu, tanh, sigmoid, identity, dropout };

// One layer of the plan; parameters by their index among the stacks.
struct Op {
  Kind kind = Kind::identity;
  int64_t weight = -1, bias = -1;
  std::shared_ptr<torch::nn::Conv2dImpl> conv;     // member 0's, for its options
  std::shared_ptr<torch::nn::MaxPool2dImpl> pool;  // likewise
  double slope = 0, p = 0;
  std::vector<DropoutImpl*> dropouts;  // one per member: each draws its own masks
  std::string signature;               // what must match across members
};

}  // namespace push::bayes::fused_plan
