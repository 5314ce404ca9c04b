#pragma once
// What the tests of one distribution over several ranks share: their small network, and
// the settings a test hands its worker processes through the environment.
#include <torch/torch.h>

#include <cstdlib>
#include <string>

namespace push::testing {

/// The particles' network: Linear(2, 1).
inline torch::nn::AnyModule linear() { return torch::nn::AnyModule(torch::nn::Linear(2, 1)); }

/// An integer from the environment, or `fallback` when it is unset.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

/// A string from the environment, or "" when it is unset.
inline std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace push::testing
