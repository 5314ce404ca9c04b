#pragma once
// Network factories from a short text spec, as `push train --model` takes them.
//   "mlp:64,64"   Linear-ReLU layers of 64 and 64 units, then a Linear output layer
//   "cnn"         conv 16 - pool - conv 32 - pool - dense 64 (for [C, H, W] inputs);
//   "cnn:8,16"    the same with 8 and 16 channels
//
//   auto factory = push::bayes::make_model("mlp:64,64", {1}, 2, /*dropout=*/0.0);
#include <push/runtime/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace push::bayes {

struct ModelSpec {
  std::string kind;             // "mlp" or "cnn"
  std::vector<int64_t> widths;  // hidden widths / conv channels
};
/// Throws push::Error naming the spec when it is not one of the forms above.
ModelSpec parse_model_spec(const std::string& spec);

/// A factory of networks from `input_shape` ({features} or {C, H, W}) to `outputs`
/// units; dropout > 0 adds push::bayes::Dropout(dropout) after every hidden layer.
ModuleFactory make_model(const ModelSpec& spec, const std::vector<int64_t>& input_shape, int64_t outputs,
                         double dropout = 0.0);
ModuleFactory make_model(const std::string& spec, const std::vector<int64_t>& input_shape, int64_t outputs,
                         double dropout = 0.0);

/// The parameters of one network make_model builds, counted without building it (a
/// memory estimate must not allocate what it estimates). A double: a spec may ask for
/// more than an int64_t holds.
double parameter_count(const ModelSpec& spec, const std::vector<int64_t>& input_shape, int64_t outputs);

}  // namespace push::bayes
