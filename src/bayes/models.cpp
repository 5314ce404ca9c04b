// The networks push train builds: MLPs and a small CNN from a text spec (push/bayes/models.h).
#include <push/bayes/mc_dropout.h>
#include <push/bayes/models.h>

#include <torch/torch.h>

namespace push::bayes {

ModelSpec parse_model_spec(const std::string& spec) {
  const char* origin = "push::bayes::parse_model_spec";
  ModelSpec m;
  auto colon = spec.find(':');
  m.kind = spec.substr(0, colon);
  PUSH_CHECK(m.kind == "mlp" || m.kind == "cnn", origin, "unknown model '", spec,
             "' (expected mlp:W1,W2,... or cnn[:C1,C2])");
  if (colon != std::string::npos) {
    std::stringstream ss(spec.substr(colon + 1));
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t used = 0;
      long long w = 0;
      try {
        w = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      PUSH_CHECK(used == item.size() && !item.empty() && w >= 1 && w <= 1 << 20, origin, "bad width '", item,
                 "' in model '", spec, "' (expected whole numbers from 1 to 1048576)");
      m.widths.push_back(w);
    }
    PUSH_CHECK(!m.widths.empty(), origin, "model '", spec, "' lists no widths");
  }
  // One rule for "mlp" and "mlp:": an MLP names its hidden layers' widths (a network with
  // none would be a linear model, on which dropout has nothing to act).
  PUSH_CHECK(m.kind != "mlp" || !m.widths.empty(), origin, "model '", spec,
             "' lists no widths (expected mlp:W1,W2,..., e.g. mlp:64,64)");
  if (m.kind == "cnn") {
    if (m.widths.empty()) m.widths = {16, 32};
    PUSH_CHECK(m.widths.size() == 2, origin, "cnn takes two channel counts (cnn:16,32), got '", spec, "'");
  }
  return m;
}

namespace {

/// What make_model and parameter_count take: push::Error naming what does not fit.
void check_inputs(const ModelSpec& spec, const std::vector<int64_t>& input_shape, int64_t outputs) {
  const char* origin = "push::bayes::make_model";
  PUSH_CHECK(outputs >= 1, origin, "outputs must be >= 1, got ", outputs);
  if (spec.kind == "cnn") {
    PUSH_CHECK(input_shape.size() == 3 && input_shape[1] >= 4 && input_shape[2] >= 4, origin,
               "cnn needs image inputs [C, H, W] of at least 4x4, got ", c10::IntArrayRef(input_shape));
  }
}

}  // namespace

ModuleFactory make_model(const ModelSpec& spec, const std::vector<int64_t>& input_shape, int64_t outputs,
                         double dropout) {
  check_inputs(spec, input_shape, outputs);
  PUSH_CHECK(!(dropout > 0) || spec.kind != "mlp" || !spec.widths.empty(), "push::bayes::make_model", "dropout ",
             dropout, " needs a hidden layer to act on, and this mlp has none (give it widths: mlp:64,64)");
  int64_t features = 1;
  for (int64_t d : input_shape) features *= d;
  return [=]() -> torch::nn::AnyModule {
    namespace nn = torch::nn;
    nn::Sequential seq;
    auto hidden = [&](int64_t in, int64_t out) {
      seq->push_back(nn::Linear(in, out));
      seq->push_back(nn::ReLU());
      if (dropout > 0) seq->push_back(Dropout(dropout));
    };
    if (spec.kind == "mlp") {
      seq->push_back(nn::Flatten());
      int64_t in = features;
      for (int64_t w : spec.widths) {
        hidden(in, w);
        in = w;
      }
      seq->push_back(nn::Linear(in, outputs));
    } else {
      const int64_t c1 = spec.widths[0], c2 = spec.widths[1];
      seq->push_back(nn::Conv2d(nn::Conv2dOptions(input_shape[0], c1, 3).padding(1)));
      seq->push_back(nn::ReLU());
      seq->push_back(nn::MaxPool2d(2));
      seq->push_back(nn::Conv2d(nn::Conv2dOptions(c1, c2, 3).padding(1)));
      seq->push_back(nn::ReLU());
      seq->push_back(nn::MaxPool2d(2));
      seq->push_back(nn::Flatten());
      hidden(c2 * (input_shape[1] / 4) * (input_shape[2] / 4), 64);
      seq->push_back(nn::Linear(64, outputs));
    }
    return to_any_module(seq);
  };
}

ModuleFactory make_model(const std::string& spec, const std::vector<int64_t>& input_shape, int64_t outputs,
                         double dropout) {
  return make_model(parse_model_spec(spec), input_shape, outputs, dropout);
}

double parameter_count(const ModelSpec& spec, const std::vector<int64_t>& input_shape, int64_t outputs) {
  check_inputs(spec, input_shape, outputs);
  auto linear = [](double in, double out) { return in * out + out; };
  double features = 1;
  for (int64_t d : input_shape) features *= static_cast<double>(d);
  double count = 0;
  if (spec.kind == "mlp") {
    double in = features;
    for (int64_t w : spec.widths) {
      count += linear(in, static_cast<double>(w));
      in = static_cast<double>(w);
    }
    return count + linear(in, static_cast<double>(outputs));
  }
  // cnn: two 3x3 convolutions (with biases), then dense 64 over the twice-pooled map.
  const double c0 = static_cast<double>(input_shape.at(0)), c1 = static_cast<double>(spec.widths.at(0)),
               c2 = static_cast<double>(spec.widths.at(1));
  const double pooled = static_cast<double>((input_shape.at(1) / 4) * (input_shape.at(2) / 4));
  return c0 * c1 * 9 + c1 + c1 * c2 * 9 + c2 + linear(c2 * pooled, 64) + linear(64, static_cast<double>(outputs));
}

}  // namespace push::bayes
